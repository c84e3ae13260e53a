// gradzip._C.Backend: the c10d backend object torch.distributed holds.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "aggregate/node_shared_memory.h"
#include "c10d/gradzip_backend.h"
#include "python/bindings.h"
#include "python/gil_free_holder.h"

namespace py = pybind11;

namespace gradzip::python {

void bind_backend(py::module_& m) {
  py::class_<gradzip::Backend, c10d::Backend, GilFreeDestructorPtr<gradzip::Backend>>(m, "Backend")
      .def(py::init([](int rank, int size, c10::intrusive_ptr<c10d::Backend> cpu_transport,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> cuda_transport, const BoundSpec& spec,
                       bool validate, std::chrono::milliseconds timeout) {
             return GilFreeDestructorPtr<gradzip::Backend>(make_backend(
                 rank, size, std::move(cpu_transport), cuda_transport.value_or(nullptr), spec, validate, timeout));
           }),
           py::arg("rank"), py::arg("size"), py::arg("cpu_transport"), py::arg("cuda_transport"),
           py::arg("spec"), py::arg("validate"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("spec", [](const gradzip::Backend& b) { return b.aggregation().spec(); })
      .def("use_spec", &gradzip::Backend::use_spec, py::arg("spec"), py::call_guard<py::gil_scoped_release>(),
           "Replaces the aggregation with one of `spec` before it holds state (gradzip.fold_momentum); every rank "
           "must give the same spec.")
      .def_property_readonly("validates", &gradzip::Backend::validates)
      .def_property_readonly("has_cuda_transport", &gradzip::Backend::has_cuda_transport)
      .def("stats", [](gradzip::Backend& b) { return stats_to_python(b.stats()); })
      .def("reset_stats", [](gradzip::Backend& b) { b.stats().reset(); })
      .def(
          "transport",
          [](const gradzip::Backend& b, const std::string& device) -> py::object {
            const auto& t = b.transport(c10::Device(device).type());
            return t ? py::cast(t) : py::none();
          },
          py::arg("device"), "The inner transport (Gloo or NCCL) that carries this device's tensors, or None.")
      .def(
          "use_node_levels",
          [](gradzip::Backend& b, const std::string& device, c10::intrusive_ptr<c10d::Backend> node,
             c10::intrusive_ptr<c10d::Backend> lane, std::vector<int64_t> ranks,
             std::optional<std::string> shared_memory) {
            b.use_node_levels(c10::Device(device).type(),
                              make_node_levels(node, lane, std::move(ranks), shared_memory));
          },
          py::arg("device"), py::arg("node"), py::arg("lane"), py::arg("ranks"),
          py::arg("shared_memory") = py::none(), py::call_guard<py::gil_scoped_release>(),
          "Splits the ranks of this device's transport into nodes: `node` joins this rank's node, `lane` the "
          "ranks of the same local index on every node, `ranks` the group rank of each (node, local rank) "
          "node by node (gradzip.node_layout); `shared_memory` names a POSIX "
          "shared-memory object for the node's CPU stages (every rank of the node passes the same name).")
      .def("use_shared_memory_check", &gradzip::Backend::use_shared_memory_check, py::arg("name"),
           py::call_guard<py::gil_scoped_release>(),
           "Collective: the collective check through the POSIX shared-memory object `name` (the same on every "
           "rank) when every rank can map it (one host); returns whether it does.")
      .def("check_channel", &gradzip::Backend::check_channel,
           "How the collective check's fingerprints travel: 'shared memory', 'transport' or 'none'.")
      .def(
          "node_levels",
          [](const gradzip::Backend& b, const std::string& device) -> py::object {
            const NodeLevels& levels = b.node_levels(c10::Device(device).type());
            if (!levels.node) return py::none();
            return py::make_tuple(levels.node, levels.lane);
          },
          py::arg("device"), "The (node, lane) transports given for this device's tensors, or None.")
      .def(
          "set_loss_scale",
          [](gradzip::Backend& b, double scale) {
            b.drain();
            b.aggregation().set_loss_scale(scale);
          },
          py::arg("scale"), py::call_guard<py::gil_scoped_release>(),
          "The loss scale the next all_reduces' inputs carry (GradScaler's), once every all_reduce issued before "
          "has finished: residuals are rescaled when it changes.")
      .def("drain", &gradzip::Backend::drain, py::call_guard<py::gil_scoped_release>(),
           "Returns once every all_reduce issued before has finished.")
      .def("state_dict", &gradzip::Backend::state_dict, py::call_guard<py::gil_scoped_release>(),
           "The aggregation's state once every all_reduce issued before has finished.")
      .def("load_state_dict", &gradzip::Backend::load_state_dict, py::call_guard<py::gil_scoped_release>(),
           "Restores the state once every all_reduce issued before has finished.");
  // The implementation's own type, so that pybind11 hands out a group's gradzip backend
  // as a gradzip._C.Backend (it looks objects up by their most-derived type).
  py::class_<GradzipBackend, gradzip::Backend, GilFreeDestructorPtr<GradzipBackend>>(m, "_GradzipBackend");
}

}  // namespace gradzip::python
