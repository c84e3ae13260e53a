#include "python/build_info.h"

#include "codec/system_libraries.h"

namespace gradzip {

#ifdef GRADZIP_WITH_CUDA
namespace cuda {
std::vector<int> compiled_architectures();  // cuda/build_info.cu
}
#endif

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

std::map<std::string, bool> system_libraries() {
  std::map<std::string, bool> built;
  for (const auto library : {SystemLibrary::kZfp, SystemLibrary::kZstd, SystemLibrary::kBlosc}) {
    built[library_name(library)] = built_with(library);
  }
  return built;
}

}  // namespace gradzip
