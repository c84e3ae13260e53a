// The codecs on CUDA device memory: encode and decode-accumulate with the GPU kernels,
// producing and reading the same payload bytes as the CPU codecs (gradzip/codec.h).
// Torch-free: memory comes from a DeviceArena (torch's caching allocator in gradzip._C,
// cudaMalloc in the tests); everything runs on the given stream.
//
// Codecs with kernels: topk, stc, sign, qsgd. Others (identity, fp16, bf16, randomk)
// have none: has_device_codec() says false, and callers use the CPU codec.
// Stream synchronizations: approximate top-k (its count), stc (its position length),
// decode (the payloads' fixed fields, then the device checks' verdict).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/codec_base.h"

namespace gradzip::cuda {

class DeviceArena {
 public:
  virtual ~DeviceArena() = default;
  // Device memory, 256-byte aligned, valid until the arena is destroyed; work queued
  // on the stream may still use it then (torch's allocator orders reuse on the stream).
  virtual void* allocate(size_t bytes) = 0;
};

// A payload in device memory; the allocation holds size rounded up to 8 bytes.
struct DevicePayload {
  uint8_t* data = nullptr;
  size_t size = 0;
};

// A payload that failed to decode, and which one (its position in the list).
class RankPayloadError : public PayloadError {
 public:
  RankPayloadError(int rank, const std::string& what) : PayloadError(what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

bool has_device_codec(CodecId id);

// make_codec(spec)->encode() on the device: x and residual (or null) hold n floats.
DevicePayload device_encode(const CodecParameters& codec, const float* x, int64_t n, float* residual,
                            const EncodeContext& ctx, DeviceArena& arena, cudaStream_t stream);

// Adds payloads r = 0 .. sizes.size() − 1, stored at payloads + r·stride (stride a
// multiple of 8), into out[0..n) in that order, as the CPU decode_add() of each would.
// Throws RankPayloadError for the first invalid payload (checks: decode_accumulate.h).
void device_decode_add(CodecId codec, const uint8_t* payloads, size_t stride, const std::vector<size_t>& sizes,
                       float* out, int64_t n, DeviceArena& arena, cudaStream_t stream);

}  // namespace gradzip::cuda
