// The MPI transport's argument checks, internal to csrc/transport/mpi: each raises an
// error naming the call (`op`) when a c10d call's tensors, ranks, reduce op or element
// counts are not what MpiBackend takes (CPU, dense, one dtype, MPI's int counts).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

// `n` elements as an MPI count: at most 2^31 − 1.
int count_of(int64_t n, const char* op);
// A defined, CPU, dense tensor.
void check_tensor(const at::Tensor& t, const char* op);
// One tensor, checked.
void check_one(const std::vector<at::Tensor>& tensors, const char* op);
// `t` checked, of `like`'s dtype and `numel` elements (`what` names it in the error).
void check_same(const at::Tensor& t, const at::Tensor& like, int64_t numel, const char* op, const char* what);
void check_rank(int rank, int size, const char* op, const char* what);
// `reduce` applies to `dtype` as Gloo applies it (no PREMUL_SUM).
void check_reduce(c10d::ReduceOp reduce, at::ScalarType dtype, const char* op);
// The root's list of `size` tensors like `like` (gather's outputs, scatter's inputs);
// the other ranks pass none.
std::vector<at::Tensor> root_list(const std::vector<std::vector<at::Tensor>>& lists, bool is_root, int size,
                                  const at::Tensor& like, const char* op, const char* what);

}  // namespace gradzip
