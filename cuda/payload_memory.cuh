// Payloads in device memory, written by the GPU encoders with the same bytes as the CPU
// codecs (docs/wire-format.md) for the same input, residual and context, each laid out
// by its codec's layout plan (<codec>_layout(), csrc/codec/<codec>_codec.h). With a
// non-null residual, an encoder leaves in it exactly what the CPU codec leaves: u − what
// the payload decodes to. Here: their memory; the fixed fields a host builds (header and
// parameters) written by a one-block kernel that takes them by value, so no host buffer
// has to outlive the call; and unaligned loads and stores of fields.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "codec/codec_record.h"
#include "codec/device_half.h"
#include "codec/payload_padding.h"
#include "cuda_check.h"

namespace gradzip::cuda {
namespace {  // each translation unit its own copy of these small kernels

// Device memory for a payload of `size` bytes (DeviceArena::payload): padded_payload_bytes,
// 8-byte aligned.
inline uint8_t* payload_memory(DeviceArena& arena, size_t size) {
  return static_cast<uint8_t*>(arena.payload(static_cast<size_t>(padded_payload_bytes(static_cast<int64_t>(size)))));
}

// The longest fixed part of any payload (stc: 38 bytes), rounded up.
constexpr size_t kMaxFixedBytes = 48;

struct FixedBytes {
  uint8_t bytes[kMaxFixedBytes];
  uint32_t count;
};

__global__ void write_fixed_bytes(uint8_t* payload, FixedBytes fixed) {
  if (threadIdx.x < fixed.count) payload[threadIdx.x] = fixed.bytes[threadIdx.x];
}

// Writes `fields` (built with wire::Writer on the host) at the start of `payload`.
inline void write_fixed_fields(uint8_t* payload, const std::vector<uint8_t>& fields, cudaStream_t stream) {
  if (fields.size() > kMaxFixedBytes) throw std::logic_error("gradzip: fixed payload fields too long");
  FixedBytes fixed{};
  std::memcpy(fixed.bytes, fields.data(), fields.size());
  fixed.count = static_cast<uint32_t>(fields.size());
  write_fixed_bytes<<<1, kMaxFixedBytes, 0, stream>>>(payload, fixed);
  check_launch("write_fixed_bytes");
}

__device__ __forceinline__ void store_le(uint8_t* at, uint64_t value, int bytes) {
  for (int b = 0; b < bytes; ++b) at[b] = static_cast<uint8_t>(value >> (8 * b));
}

__device__ __forceinline__ uint64_t load_le(const uint8_t* at, int bytes) {
  uint64_t value = 0;
  for (int b = 0; b < bytes; ++b) value |= static_cast<uint64_t>(at[b]) << (8 * b);
  return value;
}

// residual = residual + x: error feedback's u, where no encoder pass fuses it.
__global__ void add_into(float* residual, const float* x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    residual[i] = residual[i] + x[i];
  }
}

inline void make_u(float* residual, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_into<<<grid_for(n, 256), 256, 0, stream>>>(residual, x, n);
  check_launch("add_into");
}

}  // namespace
}  // namespace gradzip::cuda
