// The parts of gradzip._C, one function per concept, called by module.cpp.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include "gradzip/aggregation.h"
#include "gradzip/stats.h"

namespace gradzip::python {

void bind_backend(pybind11::module_& m);
void bind_aggregation(pybind11::module_& m);
void bind_codec(pybind11::module_& m);
void bind_topology(pybind11::module_& m);

// Aggregation state as Python sees it: {key: {"residual": Tensor or None, "calls": int, "step": int,
// "public_copies": {rank: Tensor}}}.
pybind11::dict state_to_python(const std::map<std::string, TensorState>& state);
std::map<std::string, TensorState> state_from_python(const pybind11::dict& state);

// {"calls", "bytes_sent", "bytes_received", "dense_bytes"}
pybind11::dict stats_to_python(const Stats& stats);

}  // namespace gradzip::python
