// What this build of gradzip contains: which torch it was built against, whether its
// MPI transport was built, and whether (and for which GPU architectures) its CUDA kernels were compiled.
#pragma once

#include <string>
#include <vector>

namespace gradzip {

// torch's version (without the local "+cu130" part) this build was compiled against.
std::string built_torch_version();

// True when the CUDA kernels were compiled into this build (a GPU need not be present).
bool cuda_built();

// True when the MPI transport (gradzip._C.MpiBackend) was built in.
bool mpi_built();

// The compute capabilities the kernels were compiled for, e.g. {80, 90}; empty when !cuda_built().
std::vector<int> cuda_architectures();

}  // namespace gradzip
