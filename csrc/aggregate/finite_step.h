// Finite steps: whether an all-reduce may touch error-feedback state.
//
// A compressed all-reduce with error feedback must not absorb a step whose input holds
// Inf or NaN on any rank (gradzip/codec.h: all_finite). Every rank checks its own input
// and all ranks agree in one all-reduce of a flag, before anything is encoded, so every
// rank makes the same choice: encode, or return all NaN and leave its state as it was.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

// True when x (contiguous float32, on the CPU or a GPU) holds no Inf or NaN on any rank
// of `transport`. The flag travels on `transport_device` (NCCL: the GPU). On a GPU the
// answer costs a host synchronization.
bool finite_on_every_rank(const at::Tensor& x, const c10::intrusive_ptr<c10d::Backend>& transport,
                          const at::Device& transport_device);

}  // namespace gradzip
