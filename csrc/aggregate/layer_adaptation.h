// Layer-aware compression (layers=on, adapt), internal to csrc/aggregate: what the
// all-reduce and the reduce-scatter give the choice of levels to measure.
#pragma once

#include "aggregate/compressed_allreduce.h"

namespace gradzip {

// What a choice of levels measures the levels' errors on (layers=adapt): what this call
// adds to the tensor's encoded input (into the velocity with momentum correction),
// float32, flat; not the residual, which follows the level chosen last (layer_budget.h).
at::Tensor level_input(const at::Tensor& tensor, const CompressedState& state, double momentum);

}  // namespace gradzip
