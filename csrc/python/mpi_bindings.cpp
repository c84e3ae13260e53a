// gradzip._C.MpiBackend, gradzip._C.mpi_finish and gradzip._C.mpi_library: the MPI
// transport, when it is built.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "python/bindings.h"
#include "python/gil_free_holder.h"

#ifdef GRADZIP_WITH_MPI
#include "transport/mpi/mpi_backend.h"
#include "transport/mpi/mpi_runtime.h"
#endif

namespace py = pybind11;

namespace gradzip::python {

void bind_mpi(py::module_& m) {
#ifdef GRADZIP_WITH_MPI
  py::class_<MpiBackend, c10d::Backend, GilFreeDestructorPtr<MpiBackend>>(
      m, "MpiBackend", "A c10d backend for CPU tensors over an MPI communicator (csrc/transport/mpi/mpi_backend.h).")
      .def(py::init([](int rank, int size, const std::vector<int64_t>& global_ranks,
                       std::chrono::milliseconds timeout) {
             return GilFreeDestructorPtr<MpiBackend>(
                 c10::make_intrusive<MpiBackend>(rank, size, global_ranks, timeout));
           }),
           py::arg("rank"), py::arg("size"), py::arg("global_ranks"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("largest_tag", &MpiBackend::largest_tag, "MPI_TAG_UB: point-to-point tags run 0 .. this.")
      .def_property_readonly("timeout", &MpiBackend::timeout, "The communicator's default timeout.");
  m.def("mpi_finish", &MpiBackend::finish_all, py::call_guard<py::gil_scoped_release>(),
        "Releases every MPI communicator and finalizes MPI if gradzip initialized it (at interpreter exit).");
  m.def("mpi_library", &mpi::library_version,
        "The MPI library this build links (MPI_Get_library_version), e.g. 'Open MPI v4.1.4, ...' or 'MPICH Version: ...'.");
#else
  m.def("mpi_library", [] { return std::string(); }, "Empty: this build has no MPI transport.");
#endif
}

}  // namespace gradzip::python
