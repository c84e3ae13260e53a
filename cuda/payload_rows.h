// The layouts of P payload rows (codec_record.h, PayloadRows), each read from its prefix
// by the codec's own layout parser, for a device half's queue_decode_rows.
#pragma once

#include <algorithm>
#include <vector>

#include "codec/payload_padding.h"
#include "codec/wire.h"
#include "device_codec.h"

namespace gradzip::cuda {

// parse(reader, n) on every row, in order; the first that throws PayloadError is named
// by a RankPayloadError.
template <class Parse>
auto row_layouts(const PayloadRows& rows, int64_t n, const char* codec, Parse parse) {
  std::vector<decltype(parse(std::declval<wire::Reader&>(), n))> layouts;
  const std::vector<size_t>& sizes = *rows.sizes;
  layouts.reserve(sizes.size());
  for (size_t r = 0; r < sizes.size(); ++r) {
    try {
      wire::Reader reader(rows.prefixes + r * rows.prefix_stride, std::min(rows.have, sizes[r]), sizes[r], codec);
      layouts.push_back(parse(reader, n));
    } catch (const PayloadError& e) {
      throw RankPayloadError(static_cast<int>(r), e.what());
    }
  }
  return layouts;
}

// A device half's queue_decode_add for a codec with queue_decode_rows (kDecodeRows): the
// payload decoded as a single row, added with scale 1.
template <auto kDecodeRows>
void decode_add_as_one_row(const uint8_t* payload, const uint8_t* prefix, size_t have, size_t size, float* out,
                           int64_t n, int* error, DeviceArena&, cudaStream_t stream) {
  const std::vector<size_t> sizes = {size};
  kDecodeRows(PayloadRows{payload, static_cast<size_t>(padded_payload_bytes(static_cast<int64_t>(size))), prefix, have,
                          have, &sizes},
              1.0f, false, out, n, error,
              stream);
}

// Whether every layout equals the first by `key` (what the one-pass kernel is given).
template <class Layout, class Key>
bool laid_out_alike(const std::vector<Layout>& layouts, Key key) {
  return std::all_of(layouts.begin(), layouts.end(), [&](const Layout& l) { return key(l) == key(layouts.front()); });
}

}  // namespace gradzip::cuda
