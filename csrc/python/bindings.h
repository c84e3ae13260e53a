// The parts of gradzip._C, one function per concept, called by module.cpp.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include "gradzip/stats.h"

namespace gradzip::python {

void bind_spec(pybind11::module_& m);
void bind_backend(pybind11::module_& m);
void bind_aggregation(pybind11::module_& m);
void bind_codec(pybind11::module_& m);
void bind_topology(pybind11::module_& m);
void bind_mpi(pybind11::module_& m);  // nothing when the MPI transport is not built
void bind_host_staging(pybind11::module_& m);
void bind_testing(pybind11::module_& m);  // gradzip._C.testing: for tests and benchmarks only

// {"calls", "bytes_sent", "bytes_received", "dense_bytes"}
pybind11::dict stats_to_python(const Stats& stats);

}  // namespace gradzip::python
