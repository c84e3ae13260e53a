// The architectures nvcc compiled this translation unit for, as nvcc lists them
// in __CUDA_ARCH_LIST__ (e.g. 800,900) in both the host and the device passes.
#include <vector>

namespace gradzip::cuda {

std::vector<int> compiled_architectures() {
  std::vector<int> archs = {__CUDA_ARCH_LIST__};
  for (int& arch : archs) arch /= 10;
  return archs;
}

}  // namespace gradzip::cuda
