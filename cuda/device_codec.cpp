// The codecs on the device: dispatch to each codec's device half, and the checks of the
// payloads' fixed fields (the codec's own layout parser, on the first bytes of each).
#include "device_codec.h"

#include <algorithm>

#include "cuda_check.h"
#include "decode_accumulate.h"

namespace gradzip::cuda {
namespace {

constexpr size_t kPrefixBytes = 64;  // covers every codec's fixed fields

const DeviceHalf& device_half(CodecId id) {
  const CodecRecord& record = codec_record(id);
  if (!record.device) throw std::logic_error("gradzip: codec '" + record.name + "' has no GPU kernels");
  return *record.device;
}

std::string device_check_message(CodecId codec, int bits) {
  std::string why;
  if (bits & kBadIndex) why = "an index is out of range or not ascending";
  if (bits & kBadPositions) why = "the positions do not decode to k positions inside the tensor";
  if (bits & kBadLevel) why = "a level is above the number of levels";
  return "gradzip: invalid " + codec_record(codec).name + " payload: " + why;
}

}  // namespace

bool has_device_half(const Codec& codec) {
  const DeviceHalf* half = codec_record(codec.id()).device;
  return half != nullptr && (half->accepts == nullptr || half->accepts(codec));
}

DevicePayload device_encode(const Codec& codec, const float* x, int64_t n, float* residual, const EncodeContext& ctx,
                            DeviceArena& arena, cudaStream_t stream) {
  return device_half(codec.id()).encode(codec, x, n, residual, ctx, arena, stream);
}

std::vector<uint8_t> read_row_prefixes(const uint8_t* rows, size_t stride, int count, size_t bytes,
                                       cudaStream_t stream) {
  std::vector<uint8_t> prefixes(bytes * count, 0);
  if (count == 0 || bytes == 0) return prefixes;
  int device = 0, max_pitch = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, device), "cudaDeviceGetAttribute");
  if (stride <= static_cast<size_t>(max_pitch)) {
    check(cudaMemcpy2DAsync(prefixes.data(), bytes, rows, stride, bytes, count, cudaMemcpyDeviceToHost, stream),
          "reading the payload headers");
  } else {  // slots past the 2-D copy's pitch limit (2 GiB): one copy per row
    for (int r = 0; r < count; ++r) {
      check(cudaMemcpyAsync(prefixes.data() + bytes * r, rows + stride * r, bytes, cudaMemcpyDeviceToHost, stream),
            "reading a payload header");
    }
  }
  check(cudaStreamSynchronize(stream), "payload headers");
  return prefixes;
}

size_t payload_prefix_bytes(size_t stride) { return std::min(kPrefixBytes, stride); }

int* decode_checks(int count, DeviceArena& arena, cudaStream_t stream) {
  auto* errors = static_cast<int*>(arena.allocate(sizeof(int) * std::max(count, 1)));
  if (count > 0) check(cudaMemsetAsync(errors, 0, sizeof(int) * count, stream), "clearing the payload checks");
  return errors;
}

void queue_decode_add(CodecId codec, const uint8_t* payloads, size_t stride, const std::vector<size_t>& sizes,
                      float* out, int64_t n, DeviceArena& arena, cudaStream_t stream, float scale, bool set,
                      const uint8_t* prefixes, size_t prefix_stride, int* errors) {
  const DeviceHalf& half = device_half(codec);
  const int count = static_cast<int>(sizes.size());
  if (stride % 8 != 0) throw std::logic_error("gradzip: payload stride must be a multiple of 8");
  if (count == 0) {
    if (set && n > 0) check(cudaMemsetAsync(out, 0, sizeof(float) * n, stream), "clearing the sum");
    return;
  }
  const size_t have = payload_prefix_bytes(stride);
  std::vector<uint8_t> read;
  if (!prefixes) {
    read = read_row_prefixes(payloads, stride, count, have, stream);
    prefixes = read.data();
    prefix_stride = have;
  }
  const PayloadRows rows{payloads, stride, prefixes, prefix_stride, have, &sizes};
  if (half.queue_decode_rows) {
    if (half.queue_decode_rows(rows, scale, set, out, n, errors, stream)) return;
    // Rows laid out differently: one at a time, each a one-row pass (its terms scaled as
    // the host scales them), the first setting the sum when asked to.
    for (int r = 0; r < count; ++r) {
      const std::vector<size_t> one = {sizes[r]};
      const PayloadRows row{payloads + r * stride, stride, prefixes + r * prefix_stride, prefix_stride, have, &one};
      try {
        half.queue_decode_rows(row, scale, set && r == 0, out, n, errors + r, stream);
      } catch (const RankPayloadError& e) {
        throw RankPayloadError(r, e.what());
      }
    }
    return;
  }
  // Payload after payload, each read and written by its own kernels.
  float* target = out;
  if (scale != 1.0f) {
    target = static_cast<float*>(arena.allocate(sizeof(float) * std::max<int64_t>(n, 1)));
    check(cudaMemsetAsync(target, 0, sizeof(float) * n, stream), "clearing the decode scratch");
  } else if (set) {
    check(cudaMemsetAsync(out, 0, sizeof(float) * n, stream), "clearing the sum");
  }
  for (int r = 0; r < count; ++r) {
    try {
      half.queue_decode_add(payloads + r * stride, prefixes + r * prefix_stride, std::min(have, sizes[r]), sizes[r],
                            target, n, errors + r, arena, stream);
    } catch (const PayloadError& e) {
      throw RankPayloadError(r, e.what());
    }
  }
  if (target != out) add_scaled(out, target, scale, set, n, stream);
}

void check_decoded(CodecId codec, const int* errors, int count, cudaStream_t stream) {
  if (count == 0) return;
  std::vector<int> verdict(count);
  check(cudaMemcpyAsync(verdict.data(), errors, sizeof(int) * count, cudaMemcpyDeviceToHost, stream),
        "reading the payload checks");
  check(cudaStreamSynchronize(stream), "decode-accumulate");
  for (int r = 0; r < count; ++r) {
    if (verdict[r]) throw RankPayloadError(r, device_check_message(codec, verdict[r]));
  }
}

void device_decode_add(CodecId codec, const uint8_t* payloads, size_t stride, const std::vector<size_t>& sizes,
                       float* out, int64_t n, DeviceArena& arena, cudaStream_t stream, float scale, bool set,
                       const uint8_t* prefixes, size_t prefix_stride) {
  const int count = static_cast<int>(sizes.size());
  int* errors = decode_checks(count, arena, stream);
  queue_decode_add(codec, payloads, stride, sizes, out, n, arena, stream, scale, set, prefixes, prefix_stride, errors);
  check_decoded(codec, errors, count, stream);
}

}  // namespace gradzip::cuda
