// uniform on the GPU (8-bit codes, and the fp32 path at or below the threshold):
// u = x (+ residual); its min and max by a block reduction and integer atomics on
// order-preserving keys (the exact extremes, whatever the order); then one thread per quad
// draws its Philox4x32-10 block counted by (first element, step, rank), as the CPU does,
// writes four byte codes (math::uniform_code: the CPU's rounding, in double) and leaves the
// residual u − level(code), the host codec's u + (−1 · sent). Decode adds level(code).
#include "codec/element_math.cuh"
#include "codec/uniform_codec.h"
#include "codec/wire.h"
#include "cuda_check.h"
#include "payload_memory.cuh"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

// Floats as unsigned keys whose order is the floats' order (finite inputs: the
// aggregations check finiteness before they encode).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t bits = math::float_bits(v);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}
__device__ __forceinline__ float key_float(uint32_t key) {
  return math::bits_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

// extremes[0] = min key, extremes[1] = max key (cleared to UINT32_MAX and 0 before).
__global__ void __launch_bounds__(kThreads) uniform_extremes(const float* x, const float* residual, int64_t n,
                                                             uint32_t* extremes) {
  __shared__ uint32_t low[kThreads], high[kThreads];
  uint32_t lo = 0xffffffffu, hi = 0u;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t key = order_key(residual ? residual[i] + x[i] : x[i]);
    lo = key < lo ? key : lo;
    hi = key > hi ? key : hi;
  }
  low[threadIdx.x] = lo;
  high[threadIdx.x] = hi;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      low[threadIdx.x] = min(low[threadIdx.x], low[threadIdx.x + half]);
      high[threadIdx.x] = max(high[threadIdx.x], high[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicMin(&extremes[0], low[0]);
    atomicMax(&extremes[1], high[0]);
  }
}

__global__ void uniform_clear_extremes(uint32_t* extremes) {
  if (threadIdx.x == 0) extremes[0] = 0xffffffffu, extremes[1] = 0u;
}

// Writes min and max into the payload's fixed fields (bytes 18..25).
// Writes min and max at `at` (the payload's extremes section).
__global__ void uniform_store_extremes(const uint32_t* extremes, uint8_t* at) {
  if (threadIdx.x == 0) {
    store_le(at, math::float_bits(math::uniform_extreme(key_float(extremes[0]))), 4);
    store_le(at + 4, math::float_bits(math::uniform_extreme(key_float(extremes[1]))), 4);
  }
}

__global__ void __launch_bounds__(kThreads)
    uniform_codes(const float* x, float* residual, int64_t n, const uint32_t* extremes, bool stochastic, uint64_t seed,
                  uint32_t step, uint32_t rank, uint8_t* codes) {
  const int64_t quad = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t first = 4 * quad;
  if (first >= n) return;
  const float low = math::uniform_extreme(key_float(extremes[0])), high = math::uniform_extreme(key_float(extremes[1]));
  const double unit = math::uniform_step(low, high, 8);
  const double inverse = unit > 0.0 ? 1.0 / unit : 0.0;
  const uint64_t counter = static_cast<uint64_t>(first);
  const math::Philox4 random =
      math::philox4x32_10(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), step, rank,
                          static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = first + j;
    if (i >= n) break;
    const float u = residual ? residual[i] + x[i] : x[i];
    const double up = stochastic ? static_cast<double>(math::uniform01(random.v[j])) : 0.5;
    const uint32_t code = math::uniform_code(u, low, inverse, 255u, up);
    codes[i] = static_cast<uint8_t>(code);
    if (residual) residual[i] = u + -1.0f * math::uniform_level(low, code, unit);
  }
}

// The fp32 path: the values after a 17-byte prefix (unaligned: byte stores).
__global__ void __launch_bounds__(kThreads) uniform_raw(const float* x, float* residual, int64_t n, uint8_t* values) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float u = residual ? residual[i] + x[i] : x[i];
  store_le(values + 4 * i, math::float_bits(u), 4);
  if (residual) residual[i] = u + -1.0f * u;
}

__global__ void __launch_bounds__(kThreads) uniform_add_codes(const uint8_t* codes, float low, double unit, int64_t n,
                                                              float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = out[i] + math::uniform_level(low, codes[i], unit);
}

__global__ void __launch_bounds__(kThreads) uniform_add_raw(const uint8_t* values, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = out[i] + math::bits_float(static_cast<uint32_t>(load_le(values + 4 * i, 4)));
}

}  // namespace
}  // namespace gradzip::cuda

namespace gradzip {
namespace {

DevicePayload uniform_device_encode(const Codec& uniform, const float* x, int64_t n, float* residual,
                                    const EncodeContext& ctx, DeviceArena& arena, cudaStream_t stream) {
  const UniformParameters& codec = uniform_parameters(uniform);
  // The kernels take 8-bit codes (uniform_device_accepts); min and max are written on
  // the device below.
  const UniformLayout layout = uniform_layout(n, n <= codec.threshold ? kUniformRaw : kUniformQuantized, 8, 0.0f, 0.0f);
  DevicePayload payload;
  payload.size = layout.bytes;
  payload.data = cuda::payload_memory(arena, payload.size);
  std::vector<uint8_t> fields;
  wire::Writer w(fields);
  write_uniform_fields(w, n, layout);
  cuda::write_fixed_fields(payload.data, fields, stream);
  if (layout.format == kUniformRaw) {
    if (n > 0) {
      cuda::uniform_raw<<<cuda::blocks_for(n, cuda::kThreads), cuda::kThreads, 0, stream>>>(
          x, residual, n, payload.data + layout.raw.offset);
      cuda::check_launch("uniform_raw");
    }
    return payload;
  }
  auto* extremes = static_cast<uint32_t*>(arena.allocate(2 * sizeof(uint32_t)));
  cuda::uniform_clear_extremes<<<1, 32, 0, stream>>>(extremes);
  cuda::check_launch("uniform_clear_extremes");
  cuda::uniform_extremes<<<cuda::grid_for(n, cuda::kThreads), cuda::kThreads, 0, stream>>>(x, residual, n, extremes);
  cuda::check_launch("uniform_extremes");
  cuda::uniform_store_extremes<<<1, 32, 0, stream>>>(extremes, payload.data + layout.extremes.offset);
  cuda::check_launch("uniform_store_extremes");
  cuda::uniform_codes<<<cuda::blocks_for((n + 3) / 4, cuda::kThreads), cuda::kThreads, 0, stream>>>(
      x, residual, n, extremes, codec.stochastic_rounding, ctx.seed, static_cast<uint32_t>(ctx.step), ctx.rank,
      payload.data + layout.codes.offset);
  cuda::check_launch("uniform_codes");
  return payload;
}

void uniform_device_decode_add(const uint8_t* payload, const uint8_t* prefix, size_t have, size_t size, float* out,
                               int64_t n, int*, DeviceArena&, cudaStream_t stream) {
  wire::Reader r(prefix, have, size, "uniform");
  const UniformLayout layout = read_uniform_layout(r, n);
  if (n <= 0) return;
  if (layout.format == kUniformRaw) {
    cuda::uniform_add_raw<<<cuda::blocks_for(n, cuda::kThreads), cuda::kThreads, 0, stream>>>(
        payload + layout.raw.offset, n, out);
    cuda::check_launch("uniform_add_raw");
    return;
  }
  if (layout.bits != 8) r.fail("the GPU decoder takes 8-bit codes, this payload has " + std::to_string(layout.bits));
  cuda::uniform_add_codes<<<cuda::blocks_for(n, cuda::kThreads), cuda::kThreads, 0, stream>>>(
      payload + layout.codes.offset, layout.low, math::uniform_step(layout.low, layout.high, 8), n, out);
  cuda::check_launch("uniform_add_codes");
}

bool uniform_device_accepts(const Codec& codec) { return uniform_parameters(codec).bits == 8; }

}  // namespace

const DeviceHalf kUniformDevice = {uniform_device_encode, uniform_device_decode_add, uniform_device_accepts,
                                   nullptr};

}  // namespace gradzip
