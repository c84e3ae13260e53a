// Top-k selection on the GPU: the same entries the CPU codecs choose (select_topk and
// select_topk_approx in csrc/codec/topk_select.h), ascending, from device memory.
//
// Exact: radix select on the magnitude keys (sign-cleared float bits) in three digit
// passes (11, 11, 9 bits); each pass histograms the keys that match the digits decided so
// far, and the search stops early once the boundary bucket holds exactly the entries
// still needed. Pass 1 also collects the indices in pass 0's boundary bucket when they
// are few (at most n/32), and pass 2 then reads only those. Error feedback (u = x + residual, written back) is fused into the first
// pass. Ties at the threshold go to the lowest indices, as on the CPU. Approximate: the
// threshold is the exact k·s/n-th largest key of the CPU's contiguous middle sample of
// s elements; every entry at or above it is kept (the same set as the CPU's).
//
// Two steps, so that the caller can size the index buffer: topk_prepare() makes u and
// finds the threshold, and returns how many entries will be chosen (exact: k, without
// waiting on the GPU; approximate: counted, then read back: one stream synchronization);
// topk_compact() writes their indices, ascending (an order-preserving cub::DeviceSelect).
// The threshold lives in the scratch between the two calls.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "codec/device_half.h"
#include "codec/selection_codec.h"

namespace gradzip::cuda {

// Scratch bytes the two steps need for n elements (256-byte aligned pointer).
size_t topk_scratch_bytes(int64_t n);

// With a non-null residual, leaves u = x + residual in it; u is then `residual`, else x.
int64_t topk_prepare(const float* x, float* residual, int64_t n, int64_t k, bool approx, void* scratch,
                     cudaStream_t stream);

// Writes the `count` (topk_prepare's answer) chosen indices of u, ascending.
void topk_compact(const float* u, int64_t n, int64_t* indices, void* scratch, cudaStream_t stream);

// The entries a selection codec (topk, stc) sends: both steps above, memory from `arena`.
struct Selection {
  const float* u;          // x + residual (the residual itself), or x
  const int64_t* indices;  // `count` of them, ascending
  int64_t count;
};
Selection select_on_device(const SelectionParameters& codec, const float* x, int64_t n, float* residual,
                           DeviceArena& arena, cudaStream_t stream);

}  // namespace gradzip::cuda
