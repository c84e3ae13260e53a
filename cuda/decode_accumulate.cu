// add_scaled (decode_accumulate.h): one thread per element.
#include "cuda_check.h"
#include "decode_accumulate.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    scaled_add(float* out, const float* terms, float scale, bool set, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (set ? 0.0f : out[i]) + scale * terms[i];
}

}  // namespace

void add_scaled(float* out, const float* terms, float scale, bool set, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  scaled_add<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(out, terms, scale, set, n);
  check_launch("scaled_add");
}

}  // namespace gradzip::cuda
