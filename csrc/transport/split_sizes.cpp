#include "transport/split_sizes.h"

#include <c10/util/Exception.h>

namespace gradzip {
namespace {

int64_t rows_to_elements(const at::Tensor& t, int64_t rows) {
  const int64_t total_rows = t.dim() == 0 ? 1 : t.size(0);
  return total_rows == 0 ? 0 : rows * (t.numel() / total_rows);
}

}  // namespace

std::vector<int64_t> split_elements(const at::Tensor& t, const std::vector<int64_t>& splits, int size) {
  std::vector<int64_t> out(size);
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "gradzip: all_to_all_single without split sizes needs dimension 0 (",
                rows, ") divisible by the group size (", size, ")");
    for (auto& e : out) e = rows_to_elements(t, rows / size);
    return out;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "gradzip: all_to_all_single got ", splits.size(),
              " split sizes for a group of ", size, " ranks");
  int64_t total = 0;
  for (int i = 0; i < size; ++i) {
    TORCH_CHECK(splits[i] >= 0, "gradzip: all_to_all_single got a negative split size (", splits[i], ")");
    total += splits[i];
    out[i] = rows_to_elements(t, splits[i]);
  }
  TORCH_CHECK(total == rows, "gradzip: all_to_all_single's split sizes add up to ", total,
              " rows, but the tensor has ", rows);
  return out;
}

}  // namespace gradzip
