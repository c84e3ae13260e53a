// The checks of MpiBackend's arguments (mpi_argument_checks.h): every message names the
// call and what it got. The c10d calls run them on the calling thread, before anything
// is queued or posted.
#include "transport/mpi/mpi_argument_checks.h"

#include <climits>

#include <c10/util/Exception.h>

namespace gradzip {

int count_of(int64_t n, const char* op) {
  TORCH_CHECK(n <= INT_MAX, "gradzip mpi: ", op, " moves ", n,
              " elements in one message; MPI counts are ints, so at most 2^31 - 1");
  return static_cast<int>(n);
}

void check_tensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "gradzip mpi: ", op, " got an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "gradzip mpi: ", op, " takes CPU tensors, got one on ", t.device());
  TORCH_CHECK(t.layout() == at::kStrided, "gradzip mpi: ", op, " takes dense tensors, got a ", t.layout(),
              " one");
}

void check_one(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "gradzip mpi: ", op, " takes one tensor per call, got ", tensors.size());
  check_tensor(tensors[0], op);
}

void check_same(const at::Tensor& t, const at::Tensor& like, int64_t numel, const char* op, const char* what) {
  check_tensor(t, op);
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "gradzip mpi: ", op, "'s ", what, " is ", t.scalar_type(),
              ", the input ", like.scalar_type());
  TORCH_CHECK(t.numel() == numel, "gradzip mpi: ", op, "'s ", what, " has ", t.numel(), " elements, expected ",
              numel);
}

void check_rank(int rank, int size, const char* op, const char* what) {
  TORCH_CHECK(rank >= 0 && rank < size, "gradzip mpi: ", op, "'s ", what, " ", rank,
              " is not a rank of this group of ", size);
}

void check_reduce(c10d::ReduceOp reduce, at::ScalarType dtype, const char* op) {
  using R = c10d::ReduceOp::RedOpType;
  switch (reduce.op_) {
    case R::SUM:
    case R::PRODUCT:
      return;
    case R::AVG:
      TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), "gradzip mpi: ", op,
                  " averages floating-point tensors only (as Gloo does), not ", dtype);
      return;
    case R::MIN:
    case R::MAX:
      TORCH_CHECK(!at::isComplexType(dtype), "gradzip mpi: ", op, " has no MIN or MAX of complex tensors");
      return;
    case R::BAND:
    case R::BOR:
    case R::BXOR:
      TORCH_CHECK(at::isIntegralType(dtype, /*includeBool=*/true), "gradzip mpi: ", op,
                  " applies bitwise reductions to integer and bool tensors, not ", dtype);
      return;
    default:
      TORCH_CHECK(false, "gradzip mpi: ", op, " does not support this reduce op (PREMUL_SUM), as Gloo does not");
  }
}

// The root's list of `size` tensors like `like` (gather's outputs, scatter's inputs);
// the other ranks pass none.
std::vector<at::Tensor> root_list(const std::vector<std::vector<at::Tensor>>& lists, bool is_root, int size,
                                  const at::Tensor& like, const char* op, const char* what) {
  if (!is_root) {
    TORCH_CHECK(lists.empty() || lists[0].empty(), "gradzip mpi: ", op, " takes ", what, "s on the root only");
    return {};
  }
  TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == size, "gradzip mpi: ", op,
              "'s root needs one ", what, " list of ", size, " tensors");
  for (const auto& t : lists[0]) check_same(t, like, like.numel(), op, what);
  return lists[0];
}

}  // namespace gradzip
