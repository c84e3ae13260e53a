// all_to_all_single's split sizes as element counts, shared by the backends that check
// or carry the call.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace gradzip {

// Elements sent to (or received from) each of `size` ranks: `splits` counts rows of
// dimension 0; no split sizes means equal parts. Raises when they do not fit `t`'s rows.
std::vector<int64_t> split_elements(const at::Tensor& t, const std::vector<int64_t>& splits, int size);

}  // namespace gradzip
