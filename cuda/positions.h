// Positions on the GPU: k ascending element indices written and read in the coding of
// codec/position_coding.h (Golomb-Rice gaps, or a bitmap when smaller), the same bytes
// as the CPU's. stc and compact topk (values=fp16|bf16) send their positions this way.
//
// Writing takes two steps, so that the caller can size its payload: plan_positions()
// codes the gaps' lengths and reads their total back (one stream synchronization) to
// choose the coding; write_positions_on_device() then writes the positions section. Both
// use the same scratch of position_writing_scratch_bytes(n, count).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "codec/position_coding.h"

namespace gradzip::cuda {

struct PositionPlan {
  int golomb_parameter = 0;
  uint64_t golomb_bits = 0;
  bool bitmap = false;
  size_t position_bytes = 0;
  PositionCoding coding() const { return {bitmap, golomb_parameter, position_bytes}; }
};
size_t position_writing_scratch_bytes(int64_t n, int64_t count);
PositionPlan plan_positions(int64_t n, const int64_t* indices, int64_t count, void* scratch, cudaStream_t stream);
// The positions section alone (plan.position_bytes at `out`).
void write_positions_on_device(const PositionPlan& plan, int64_t n, const int64_t* indices, int64_t count,
                               uint8_t* out, void* scratch, cudaStream_t stream);

// Scratch for reading one payload's positions: k indices, and the bitmap's per-word
// ranks or the Golomb decoder's segment tables (sized for any parameter b <= 40) and
// per-code arrays.
size_t position_reading_scratch_bytes(int64_t n, int64_t k, const PositionLayout& positions);
// The k positions of a payload (its section `positions`, checked on the host), in the
// scratch: valid where *error stays 0 (the data's checks set kBadPositions,
// decode_accumulate.h). Null when there is nothing to add (k = 0).
const int64_t* read_positions_on_device(const uint8_t* payload, const PositionLayout& positions, int64_t k, int64_t n,
                                        int* error, void* scratch, cudaStream_t stream);

}  // namespace gradzip::cuda
