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
  return half != nullptr && (half->accepts == nullptr || half->accepts(codec.parameters()));
}

DevicePayload device_encode(const Codec& codec, const float* x, int64_t n, float* residual, const EncodeContext& ctx,
                            DeviceArena& arena, cudaStream_t stream) {
  return device_half(codec.id()).encode(codec.parameters(), x, n, residual, ctx, arena, stream);
}

void device_decode_add(CodecId codec, const uint8_t* payloads, size_t stride, const std::vector<size_t>& sizes,
                       float* out, int64_t n, DeviceArena& arena, cudaStream_t stream) {
  const DeviceHalf& half = device_half(codec);
  const int count = static_cast<int>(sizes.size());
  if (count == 0) return;
  if (stride % 8 != 0) throw std::logic_error("gradzip: payload stride must be a multiple of 8");
  const size_t have = std::min(kPrefixBytes, stride);
  std::vector<uint8_t> prefixes(kPrefixBytes * count, 0);
  check(cudaMemcpy2DAsync(prefixes.data(), kPrefixBytes, payloads, stride, have, count, cudaMemcpyDeviceToHost, stream),
        "reading the payload headers");
  auto* errors = static_cast<int*>(arena.allocate(sizeof(int) * count));
  check(cudaMemsetAsync(errors, 0, sizeof(int) * count, stream), "clearing the payload checks");
  check(cudaStreamSynchronize(stream), "payload headers");
  for (int r = 0; r < count; ++r) {
    try {
      half.queue_decode_add(payloads + r * stride, prefixes.data() + r * kPrefixBytes, std::min(have, sizes[r]),
                            sizes[r], out, n, errors + r, arena, stream);
    } catch (const PayloadError& e) {
      throw RankPayloadError(r, e.what());
    }
  }
  std::vector<int> verdict(count);
  check(cudaMemcpyAsync(verdict.data(), errors, sizeof(int) * count, cudaMemcpyDeviceToHost, stream),
        "reading the payload checks");
  check(cudaStreamSynchronize(stream), "decode-accumulate");
  for (int r = 0; r < count; ++r) {
    if (verdict[r]) throw RankPayloadError(r, device_check_message(codec, verdict[r]));
  }
}

}  // namespace gradzip::cuda
