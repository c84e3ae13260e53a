// gradzip._C.HostStagedBackend: GPU tensors over a host transport, through host buffers
// (csrc/transport/host_staged_backend.h).
#include "python/bindings.h"
#include "python/gil_free_holder.h"
#include "transport/host_staged_backend.h"

namespace py = pybind11;

namespace gradzip::python {

void bind_host_staging(py::module_& m) {
  py::class_<HostStagedBackend, c10d::Backend, GilFreeDestructorPtr<HostStagedBackend>>(
      m, "HostStagedBackend",
      "A c10d backend that carries tensors of any device over `host` (a Gloo or gradzip MPI backend of the same "
      "ranks) by copying them through host buffers: a gradzip group's CUDA transport where its ranks share a GPU.")
      .def(py::init([](c10::intrusive_ptr<c10d::Backend> host) {
             return GilFreeDestructorPtr<HostStagedBackend>(c10::make_intrusive<HostStagedBackend>(std::move(host)));
           }),
           py::arg("host"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("host", &HostStagedBackend::host, "The host transport this backend stages over.");
}

}  // namespace gradzip::python
