// gradzip._C: bindings only. Import torch.distributed before this module, so that
// pybind11 knows c10d::Backend, the base class of gradzip.Backend.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "python/build_info.h"
#include "python/bindings.h"
#include "python/gil_free_holder.h"
#include "work/exit_gate.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "gradzip's C++ core";
  gradzip::python::import_thread();  // this thread, remembered before any backend exists
  gradzip::python::bind_spec(m);
  gradzip::python::bind_backend(m);
  gradzip::python::bind_aggregation(m);
  gradzip::python::bind_codec(m);
  gradzip::python::bind_topology(m);
  gradzip::python::bind_mpi(m);
  gradzip::python::bind_host_staging(m);
  gradzip::python::bind_testing(m);

  m.def("_close_exit_gate", &gradzip::exit_gate::close, py::call_guard<py::gil_scoped_release>(),
        "At interpreter exit: gradzip's threads finish the completions they are in and complete no more "
        "(work/exit_gate.h).");
  m.def("cuda_built", &gradzip::cuda_built);
  m.def("mpi_built", &gradzip::mpi_built);
  m.def("cuda_architectures", &gradzip::cuda_architectures);
  m.def("system_libraries", &gradzip::system_libraries);
}
