// What this build of gradzip contains: whether its MPI transport was built, whether (and for
// which GPU architectures) its CUDA kernels were compiled, and which optional system
// libraries it uses. (The torch it was built against is in gradzip/_build.json, readable
// without loading this module.)
#pragma once

#include <map>
#include <string>
#include <vector>

namespace gradzip {

// True when the CUDA kernels were compiled into this build (a GPU need not be present).
bool cuda_built();

// True when the MPI transport (gradzip._C.MpiBackend) was built in.
bool mpi_built();

// The compute capabilities the kernels were compiled for, e.g. {80, 90}; empty when !cuda_built().
std::vector<int> cuda_architectures();

// The optional system libraries (codec/system_libraries.h) by name, each true when built in.
std::map<std::string, bool> system_libraries();

}  // namespace gradzip
