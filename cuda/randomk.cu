// randomk on the GPU. The entries depend on (n, k, seed, step) only, never on the data:
// the host draws them with the CPU codec's own sampler (randomk_indices) and copies them
// to the device (k × 8 bytes, on the stream; a pageable copy returns once its bytes are
// staged, so the host vector may go). Encode: one thread per entry copies u[index] into
// the payload and leaves the residual u + (−1 · scale · u), as the host's decode_add(−1)
// does; decode: out[index] += value_scale · value, payload after payload.
#include <algorithm>
#include <vector>

#include "codec/randomk_codec.h"
#include "codec/wire.h"
#include "cuda_check.h"
#include "payload_memory.cuh"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    randomk_gather(const float* u, const int64_t* indices, int64_t k, float value_scale, float* values,
                   float* residual) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const int64_t i = indices[j];
  const float v = u[i];
  values[j] = v;
  if (residual) residual[i] = v + -1.0f * (value_scale * v);
}

__global__ void __launch_bounds__(kThreads)
    randomk_add(const int64_t* indices, const float* values, int64_t k, float value_scale, float* out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < k) out[indices[j]] += value_scale * values[j];
}

// The entries (seed, step) choose, in device memory from `arena`.
const int64_t* indices_on_device(int64_t n, int64_t k, uint64_t seed, uint64_t step, DeviceArena& arena,
                                 cudaStream_t stream) {
  const auto chosen = randomk_indices(n, k, seed, step);
  auto* indices = static_cast<int64_t*>(arena.allocate(sizeof(int64_t) * std::max<int64_t>(k, 1)));
  if (k > 0) {
    check(cudaMemcpyAsync(indices, chosen->data(), sizeof(int64_t) * k, cudaMemcpyHostToDevice, stream),
          "copying the random-k entries");
  }
  return indices;
}

}  // namespace
}  // namespace gradzip::cuda

namespace gradzip {
namespace {

DevicePayload randomk_device_encode(const Codec& randomk, const float* x, int64_t n, float* residual,
                                    const EncodeContext& ctx, DeviceArena& arena, cudaStream_t stream) {
  const RandomKParameters& codec = randomk_parameters(randomk);
  const RandomKLayout layout = randomk_layout(n, codec, ctx.seed, ctx.step);
  const auto k = static_cast<int64_t>(layout.k);
  DevicePayload payload;
  payload.size = layout.bytes;
  payload.data = cuda::payload_memory(arena, payload.size);
  std::vector<uint8_t> fields;
  wire::Writer w(fields);
  write_randomk_fields(w, n, layout);
  cuda::write_fixed_fields(payload.data, fields, stream);
  if (residual) cuda::make_u(residual, x, n, stream);
  if (k <= 0) return payload;
  const int64_t* indices = cuda::indices_on_device(n, k, ctx.seed, ctx.step, arena, stream);
  cuda::randomk_gather<<<cuda::blocks_for(k, cuda::kThreads), cuda::kThreads, 0, stream>>>(
      residual ? residual : x, indices, k, layout.value_scale, reinterpret_cast<float*>(payload.data + layout.values.offset),
      residual);
  cuda::check_launch("randomk_gather");
  return payload;
}

void randomk_device_decode_add(const uint8_t* payload, const uint8_t* prefix, size_t have, size_t size, float* out,
                               int64_t n, int*, DeviceArena& arena, cudaStream_t stream) {
  wire::Reader r(prefix, have, size, "randomk");
  const RandomKLayout layout = read_randomk_layout(r, n);
  const auto k = static_cast<int64_t>(layout.k);
  if (k <= 0) return;
  const int64_t* indices = cuda::indices_on_device(n, k, layout.seed, layout.step, arena, stream);
  cuda::randomk_add<<<cuda::blocks_for(k, cuda::kThreads), cuda::kThreads, 0, stream>>>(
      indices, reinterpret_cast<const float*>(payload + layout.values.offset), k, layout.value_scale, out);
  cuda::check_launch("randomk_add");
}

}  // namespace

const DeviceHalf kRandomKDevice = {randomk_device_encode, randomk_device_decode_add, nullptr, nullptr};

}  // namespace gradzip
