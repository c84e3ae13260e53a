// gradzip._C.Aggregation: the engine behind the DDP hook and the model-level API.
#include <pybind11/stl.h>

#include "aggregate/direct_aggregation.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace gradzip::python {

py::dict stats_to_python(const Stats& stats) {
  const auto s = stats.snapshot();
  return py::dict(py::arg("calls") = s.calls, py::arg("bytes_sent") = s.bytes_sent,
                  py::arg("bytes_received") = s.bytes_received, py::arg("dense_bytes") = s.dense_bytes);
}

void bind_aggregation(py::module_& m) {
  py::class_<DirectAggregation>(m, "Aggregation")
      .def(py::init<const BoundSpec&>(), py::arg("spec"))
      .def_property_readonly("spec", [](const DirectAggregation& a) { return a.aggregation().spec(); })
      .def("allreduce", &DirectAggregation::allreduce, py::arg("tensor"), py::arg("key"), py::arg("op"),
           py::arg("transport"), py::call_guard<py::gil_scoped_release>(),
           "Reduces `tensor` in place over `transport`; `key` names its state. Returns when done.")
      .def(
          "allreduce_pieces",
          [](DirectAggregation& a, const at::Tensor& tensor, const std::vector<std::pair<std::string, int64_t>>& pieces,
             const c10d::ReduceOp& op, const c10::intrusive_ptr<c10d::Backend>& transport) {
            std::vector<TensorPiece> named;
            for (const auto& [key, numel] : pieces) named.push_back({key, numel});
            py::gil_scoped_release no_gil;
            a.allreduce_pieces(tensor, named, op, transport);
          },
          py::arg("tensor"), py::arg("pieces"), py::arg("op"), py::arg("transport"),
          "Reduces `tensor`, the concatenation of the (key, numel) pieces, in place; each piece keeps its state.")
      .def("state_dict", [](const DirectAggregation& a) { return a.aggregation().state_dict(); })
      .def("load_state_dict",
           [](DirectAggregation& a, const std::map<std::string, at::Tensor>& state) {
             a.aggregation().load_state_dict(state);
           })
      .def("stats", [](DirectAggregation& a) { return stats_to_python(a.stats()); })
      .def("reset_stats", [](DirectAggregation& a) { a.stats().reset(); });
}

}  // namespace gradzip::python
