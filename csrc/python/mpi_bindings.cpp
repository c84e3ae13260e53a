// gradzip._C.MpiBackend and gradzip._C.mpi_finish: the MPI transport, when it is built.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "python/bindings.h"
#include "python/gil_free_holder.h"

#ifdef GRADZIP_WITH_MPI
#include "transport/mpi/mpi_backend.h"
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
           py::call_guard<py::gil_scoped_release>());
  m.def("mpi_finish", &MpiBackend::finish_all, py::call_guard<py::gil_scoped_release>(),
        "Releases every MPI communicator and finalizes MPI if gradzip initialized it (at interpreter exit).");
#else
  (void)m;
#endif
}

}  // namespace gradzip::python
