// EntryCodec: a codec whose payload is k entries at ascending positions, a value each
// (top-k, STC). Its decode adds each entry's value at its position; a sum of several
// payloads is written range by range instead (sum_rows_by_range): the output written
// once, in order, rather than zeroed and then added to at P·k scattered positions, each
// a cache miss in a large output.
#pragma once

#include <cstdint>
#include <vector>

#include "codec/codec_base.h"

namespace gradzip {

// A payload's entries: ascending positions below n, and the value added at each.
struct Entries {
  std::vector<int64_t> positions;
  std::vector<float> values;
  uint64_t count() const { return positions.size(); }
};

class EntryCodec : public CodecBase {
 public:
  using CodecBase::CodecBase;
  // out[p] += v for each entry (p, v) of decode_entries(..., scale): the entries decoded
  // into a buffer of the calling thread (kept as thread_entry_rows' are), then added,
  // their targets prefetched.
  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const final;
  // The payload's entries, each value scale × the sent one, rounded as decode_add() adds
  // it; `entries` resized to k. Checks the payload as a decode must: PayloadError
  // (`entries` then unspecified), before anything is written anywhere else.
  virtual void decode_entries(const uint8_t* data, size_t size, int64_t n, float scale, Entries& entries) const = 0;
};

// The calling thread's buffers for `rows` payloads' entries (set_rows_by_range's), kept
// from call to call so that decodes neither allocate nor fault in fresh pages; one that
// grew past 4M entries is freed at the thread's next call.
std::vector<Entries>& thread_entry_rows(int rows);

// out[0, n) = the entries of `rows` summed in row order, every other element +0: the bits
// of out zeroed, then decode_add() of each row's payload in turn. Range by range (the
// range's part of the sum built in L1, each row's entries in it added in turn), the
// output written once, past the caches when it is large.
void sum_rows_by_range(const std::vector<Entries>& rows, float* out, int64_t n);

// sum_rows_by_range of the entries of the payloads `data(r)` (size(r) bytes), r in [0,
// rows), decoded by `codec` with `scale`; a PayloadError from payload r goes to
// on_error(r, error), which throws, before anything is written. The entries lie in
// buffers of the calling thread (thread_entry_rows).
template <class Data, class Size, class OnError>
void set_rows_by_range(const EntryCodec& codec, int rows, Data data, Size size, float* out, int64_t n, float scale,
                       OnError on_error) {
  std::vector<Entries>& decoded = thread_entry_rows(rows);
  for (int r = 0; r < rows; ++r) {
    try {
      codec.decode_entries(data(r), size(r), n, scale, decoded[r]);
    } catch (const PayloadError& e) {
      on_error(r, e);
    }
  }
  sum_rows_by_range(decoded, out, n);
}

}  // namespace gradzip
