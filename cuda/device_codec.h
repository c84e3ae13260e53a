// The codecs on CUDA device memory: encode and decode-accumulate through each codec's
// device half (CodecRecord::device, defined in its .cu), producing and reading the same
// payload bytes as the host codecs (gradzip/codec.h). Torch-free: memory comes from a
// DeviceArena (torch's caching allocator in gradzip._C, cudaMalloc in the tests);
// everything runs on the given stream.
//
// Codecs without a device half have_device_half() false: callers use the host codec.
// Stream synchronizations: approximate top-k (its count), stc (its position length),
// decode (the payloads' fixed fields, then the device checks' verdict).
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "codec/codec_record.h"

namespace gradzip::cuda {

// A payload that failed to decode, and which one (its position in the list).
class RankPayloadError : public PayloadError {
 public:
  RankPayloadError(int rank, const std::string& what) : PayloadError(what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// Whether the codec, with its parameters, runs on the GPU (else its host codec does).
bool has_device_half(const Codec& codec);

// codec.encode() on the device: x and residual (or null) hold n floats.
DevicePayload device_encode(const Codec& codec, const float* x, int64_t n, float* residual, const EncodeContext& ctx,
                            DeviceArena& arena, cudaStream_t stream);

// Adds payloads r = 0 .. sizes.size() − 1, stored at payloads + r·stride (stride a
// multiple of 8), into out[0..n) in that order, as the host decode_add() of each would.
// Throws RankPayloadError for the first invalid payload (checks: decode_accumulate.h).
void device_decode_add(CodecId codec, const uint8_t* payloads, size_t stride, const std::vector<size_t>& sizes,
                       float* out, int64_t n, DeviceArena& arena, cudaStream_t stream);

}  // namespace gradzip::cuda
