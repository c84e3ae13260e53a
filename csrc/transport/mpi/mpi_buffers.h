// Tensors as MPI message buffers, internal to csrc/transport/mpi: the caller's tensors
// staged contiguous, several tensors as one flat buffer, and MPI's datatypes, counts and
// offsets for them.
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "transport/mpi/mpi_runtime.h"

namespace gradzip {

// A contiguous tensor with `t`'s values: `t` itself when it is contiguous.
at::Tensor staged(const at::Tensor& t);
// Copies `staging` back into `t` when it stood in for it.
void unstage(const at::Tensor& staging, const at::Tensor& t);
// All of `tensors`, flattened, one after another.
at::Tensor flat_cat(const std::vector<at::Tensor>& tensors);
// Copies consecutive pieces of `flat` into `tensors`.
void flat_split(const at::Tensor& flat, const std::vector<at::Tensor>& tensors);
// The MPI datatype that moves `t`'s elements (by their size).
MPI_Datatype type_of(const at::Tensor& t);
// The offsets of blocks of `counts` elements laid end to end, each an MPI count.
std::vector<int> offsets_of(const std::vector<int>& counts, const char* op);
// `counts`, each an MPI count.
std::vector<int> int_counts(const std::vector<int64_t>& counts, const char* op);

}  // namespace gradzip
