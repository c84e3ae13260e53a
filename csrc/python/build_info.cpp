#include "python/build_info.h"

namespace gradzip {

#ifdef GRADZIP_WITH_CUDA
namespace cuda {
std::vector<int> compiled_architectures();  // cuda/build_info.cu
}
#endif

std::string built_torch_version() { return GRADZIP_TORCH_VERSION; }

bool cuda_built() {
#ifdef GRADZIP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool mpi_built() {
#ifdef GRADZIP_WITH_MPI
  return true;
#else
  return false;
#endif
}

std::vector<int> cuda_architectures() {
#ifdef GRADZIP_WITH_CUDA
  return cuda::compiled_architectures();
#else
  return {};
#endif
}

}  // namespace gradzip
