// Error checks and launch sizes for the host dispatch functions (torch-free).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace gradzip::cuda {

// Throws std::runtime_error naming `what` when a CUDA call failed.
inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("gradzip: CUDA ") + what + ": " + cudaGetErrorString(status));
  }
}

// Checks the last launch (configuration errors surface here, faults at the next sync).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Blocks for a grid-stride loop over `items` with `threads` per block: enough to fill
// the current device (a few blocks per SM), no more than the items need.
inline unsigned grid_for(int64_t items, int threads, int blocks_per_sm = 4) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const int64_t wanted = (items + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sms) * blocks_per_sm;
  return static_cast<unsigned>(wanted < 1 ? 1 : wanted < cap ? wanted : cap);
}

// Blocks for one thread per item (at most 2^31 − 1 blocks).
inline unsigned blocks_for(int64_t items, int threads) {
  const int64_t blocks = (items + threads - 1) / threads;
  if (blocks > INT32_MAX) throw std::runtime_error("gradzip: CUDA launch over too many items");
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

}  // namespace gradzip::cuda
