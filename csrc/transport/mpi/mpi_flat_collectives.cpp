// The collectives on flat, contiguous buffers that MpiBackend's c10d calls are built
// from, run on the worker thread. Reductions are computed by torch, not MPI: each rank
// reduces the chunk it owns over every rank's copy, in rank order (r0 op r1 op ...), then
// the chunks are gathered, so every rank ends bitwise identical whatever the MPI library.
#include "transport/mpi/mpi_backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "transport/mpi/mpi_argument_checks.h"
#include "transport/mpi/mpi_buffers.h"

namespace gradzip {

at::Tensor MpiBackend::scratch(int64_t numel, const at::TensorOptions& options) {
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  if (!scratch_.defined() || scratch_.numel() < bytes) scratch_ = at::empty({bytes}, at::kByte);
  return scratch_.narrow(0, 0, bytes).view(c10::typeMetaToScalarType(options.dtype()));
}

void MpiBackend::reduce_rows(const at::Tensor& pieces, const at::Tensor& out, c10d::ReduceOp reduce) const {
  using R = c10d::ReduceOp::RedOpType;
  at::Tensor result = out;  // the _out functions take a non-const reference
  out.copy_(pieces[0]);
  for (int64_t r = 1; r < pieces.size(0); ++r) {
    const at::Tensor piece = pieces[r];
    switch (reduce.op_) {
      case R::SUM:
      case R::AVG: out.add_(piece); break;
      case R::PRODUCT: out.mul_(piece); break;
      case R::MIN: at::minimum_out(result, out, piece); break;
      case R::MAX: at::maximum_out(result, out, piece); break;
      case R::BAND: out.bitwise_and_(piece); break;
      case R::BOR: out.bitwise_or_(piece); break;
      case R::BXOR: out.bitwise_xor_(piece); break;
      default: TORCH_CHECK(false, "gradzip mpi: unsupported reduce op");
    }
  }
  if (reduce.op_ == R::AVG) out.div_(pieces.size(0));
}

std::pair<std::vector<int>, std::vector<int>> MpiBackend::reduce_own_chunk(const char* op, const at::Tensor& flat,
                                                                           c10d::ReduceOp reduce) {
  const int size = getSize(), rank = getRank();
  const int64_t n = flat.numel();
  count_of(n, op);
  std::vector<int> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = static_cast<int>(n / size + (r < n % size ? 1 : 0));
  std::vector<int> offsets = offsets_of(counts, op);
  const int mine = counts[rank];
  const at::Tensor pieces = scratch(int64_t{size} * mine, flat.options()).view({size, mine});
  std::vector<int> piece_counts(size, mine), piece_offsets(size);
  for (int r = 0; r < size; ++r) piece_offsets[r] = r * mine;
  const MPI_Datatype type = type_of(flat);
  exchange(op, "MPI_Ialltoallv", [&](MPI_Request* request) {
    return MPI_Ialltoallv(flat.data_ptr(), counts.data(), offsets.data(), type, pieces.data_ptr(),
                          piece_counts.data(), piece_offsets.data(), type, comm_, request);
  });
  reduce_rows(pieces, flat.narrow(0, offsets[rank], mine), reduce);
  return {counts, offsets};
}

void MpiBackend::allreduce_flat(const char* op, const at::Tensor& flat, c10d::ReduceOp reduce) {
  auto [counts, offsets] = reduce_own_chunk(op, flat, reduce);
  const MPI_Datatype type = type_of(flat);
  exchange(op, "MPI_Iallgatherv", [&](MPI_Request* request) {
    return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, flat.data_ptr(), counts.data(), offsets.data(),
                           type, comm_, request);
  });
}

void MpiBackend::reduce_scatter_flat(const char* op, const at::Tensor& send, const at::Tensor& receive,
                                     c10d::ReduceOp reduce) {
  const int m = static_cast<int>(receive.numel());
  const at::Tensor pieces = scratch(int64_t{getSize()} * m, receive.options()).view({getSize(), m});
  exchange(op, "MPI_Ialltoall", [&](MPI_Request* request) {
    return MPI_Ialltoall(send.data_ptr(), m, type_of(send), pieces.data_ptr(), m, type_of(send), comm_, request);
  });
  reduce_rows(pieces, receive.view({-1}), reduce);
}

void MpiBackend::allgather_flat(const char* op, const at::Tensor& send, const at::Tensor& receive) {
  const int n = static_cast<int>(send.numel());
  exchange(op, "MPI_Iallgather", [&](MPI_Request* request) {
    return MPI_Iallgather(send.data_ptr(), n, type_of(send), receive.data_ptr(), n, type_of(send), comm_, request);
  });
}

}  // namespace gradzip
