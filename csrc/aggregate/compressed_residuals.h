// Error feedback's state tensors, internal to csrc/aggregate: where a CompressedState's
// residuals live, and the owner residual kept for the chunk a rank owns.
#pragma once

#include <string>

#include "aggregate/compressed_allreduce.h"

namespace gradzip {

// A state tensor about to be used by work queued on the current stream
// (record_on_current_stream: CUDA tensors only).
const at::Tensor& used_on_current_stream(const at::Tensor& t);

// The state's residual as a float32 tensor of n elements on `device` (zeros at first).
at::Tensor& residual_on(CompressedState& state, const at::Device& device, int64_t n, const std::string& key);

// Makes the state's owner residual that of elements [owned.begin, owned.begin +
// owned.length) of its tensor (zeros when new). An owner residual of other elements goes
// back into the worker residual first (it would never be sent otherwise): the sum is
// linear, so this rank's next contribution carries it instead of its owner's. Only
// with error feedback.
void own_chunk(CompressedState& state, const Chunk& owned, const at::Device& device, int64_t n,
               const std::string& key);

}  // namespace gradzip
