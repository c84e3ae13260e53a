// The point-to-point tags a transport carries. Gloo takes any non-negative int; MPI
// takes 0 .. MPI_TAG_UB, which the library sets (Open MPI: 2^31 - 1; MPICH: 2^28 - 1;
// the standard promises at least 32767).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

// The largest tag `transport` carries.
int largest_tag(const c10d::Backend& transport);

}  // namespace gradzip
