// Tensors as MPI message buffers (mpi_buffers.h): staging copies only tensors that are
// not contiguous; counts and offsets are checked to fit MPI's ints.
#include "transport/mpi/mpi_buffers.h"

#include "transport/mpi/mpi_argument_checks.h"

namespace gradzip {

at::Tensor staged(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
void unstage(const at::Tensor& staging, const at::Tensor& t) {
  if (!staging.is_same(t)) t.copy_(staging.view(t.sizes()));
}
at::Tensor flat_cat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}
void flat_split(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

MPI_Datatype type_of(const at::Tensor& t) { return mpi::element_type(t.element_size()); }

std::vector<int> offsets_of(const std::vector<int>& counts, const char* op) {
  std::vector<int> offsets(counts.size());
  int64_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = count_of(at, op);
    at += counts[i];
  }
  count_of(at, op);
  return offsets;
}

std::vector<int> int_counts(const std::vector<int64_t>& counts, const char* op) {
  std::vector<int> out;
  for (auto c : counts) out.push_back(count_of(c, op));
  return out;
}

}  // namespace gradzip
