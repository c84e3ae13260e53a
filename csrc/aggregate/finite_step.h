// Finite steps: whether an all-reduce may touch error-feedback state.
//
// A compressed all-reduce with error feedback must not absorb a step whose input holds
// Inf or NaN on any rank (gradzip/codec.h: all_finite). Every rank checks its own input
// and all ranks agree, before anything is encoded, so every rank makes the same choice:
// encode, or return all NaN and leave its state as it was. They agree in one all-reduce
// of a flag, or in a message the caller exchanges anyway (the backend's collective check).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

// True when x holds no Inf or NaN (float16 and bfloat16 widen to float32 exactly, so the
// answer is the same for x as a compressed aggregation's float32 copy of it). On a GPU the
// answer costs a host synchronization.
bool locally_finite(const at::Tensor& x);

// True when x (contiguous float32, on the CPU or a GPU) holds no Inf or NaN on any rank
// of `transport`. The flag travels on `transport_device` (NCCL: the GPU). On a GPU the
// answer costs a host synchronization.
bool finite_on_every_rank(const at::Tensor& x, const c10::intrusive_ptr<c10d::Backend>& transport,
                          const at::Device& transport_device);
// The same, for a rank that already knows its own answer (`finite_here`: a pass that read
// its input anyway checked it).
bool finite_on_every_rank(bool finite_here, const c10::intrusive_ptr<c10d::Backend>& transport,
                          const at::Device& transport_device);

}  // namespace gradzip
