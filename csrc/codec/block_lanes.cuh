// The CPU codecs sum a block of `length` elements in eight float lanes: element
// begin + 8m + l into lane l (m ascending), the length % 8 tail into lane 0 after, then
// the lanes in order in double (sign's ‖u‖₁ scale, QSGD's L2 norm). Here eight
// consecutive threads of a warp do the same for one block, one lane each, and the
// group's first thread gathers the lanes by shuffles in the same order: the same bits.
#pragma once

#include <cstdint>

namespace gradzip::cuda {
namespace {

constexpr int kLanes = 8;

// Each thread's lane sum of f(u_i) over its lane; all 32 threads of the warp must call it.
template <typename Term>
__device__ __forceinline__ float lane_sum(const float* v, int64_t length, int lane, bool valid, Term term) {
  float sum = 0.0f;
  if (valid) {
    const int64_t full = length / kLanes * kLanes;
    for (int64_t i = lane; i < full; i += kLanes) sum = sum + term(v[i]);
    if (lane == 0) {
      for (int64_t i = full; i < length; ++i) sum = sum + term(v[i]);
    }
  }
  return sum;
}

// Lane 0 of each group of eight gets the lanes' total in double, summed in lane order.
__device__ __forceinline__ double lanes_total(float lane_value) {
  double total = 0.0;
  const int group = (threadIdx.x % 32) / kLanes * kLanes;
#pragma unroll
  for (int l = 0; l < kLanes; ++l) total += static_cast<double>(__shfl_sync(0xffffffffu, lane_value, group + l));
  return total;
}

}  // namespace
}  // namespace gradzip::cuda
