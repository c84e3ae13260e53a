// gradzip._C.Aggregation: an aggregation used directly by the DDP hook and the
// model-level API, over any process group's transport, with its own byte counters.
#include <pybind11/stl.h>

#include "python/bindings.h"

namespace py = pybind11;

namespace gradzip::python {
namespace {

struct PyAggregation {
  explicit PyAggregation(const std::string& spec) : aggregation(make_aggregation(parse_spec(spec))) {}
  std::unique_ptr<Aggregation> aggregation;
  Stats stats;
};

}  // namespace

py::dict stats_to_python(const Stats& stats) {
  const auto s = stats.snapshot();
  return py::dict(py::arg("calls") = s.calls, py::arg("bytes_sent") = s.bytes_sent,
                  py::arg("bytes_received") = s.bytes_received, py::arg("dense_bytes") = s.dense_bytes);
}

namespace {

at::Tensor to_tensor(const std::vector<float>& values) {
  return at::from_blob(const_cast<float*>(values.data()), {static_cast<int64_t>(values.size())}, at::kFloat).clone();
}

std::vector<float> from_tensor(const py::handle& object) {
  const auto t = object.cast<at::Tensor>().to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}

py::dict tensor_state_to_python(const TensorState& s) {
  py::object residual = py::none();
  if (!s.residual.empty()) residual = py::cast(to_tensor(s.residual));
  py::dict copies;
  for (const auto& [rank, copy] : s.public_copies) copies[py::int_(rank)] = to_tensor(copy);
  return py::dict(py::arg("residual") = residual, py::arg("calls") = s.calls, py::arg("step") = s.step,
                  py::arg("public_copies") = copies);
}

TensorState tensor_state_from_python(const py::dict& entry) {
  TensorState s;
  s.calls = entry["calls"].cast<int64_t>();
  s.step = entry["step"].cast<uint64_t>();
  if (!entry["residual"].is_none()) s.residual = from_tensor(entry["residual"]);
  if (entry.contains("public_copies")) {
    for (const auto& [rank, copy] : entry["public_copies"].cast<py::dict>()) {
      s.public_copies.emplace(rank.cast<int>(), from_tensor(copy));
    }
  }
  return s;
}

}  // namespace

py::dict state_to_python(const std::map<std::string, TensorState>& state) {
  py::dict out;
  for (const auto& [key, s] : state) out[py::str(key)] = tensor_state_to_python(s);
  return out;
}

std::map<std::string, TensorState> state_from_python(const py::dict& state) {
  std::map<std::string, TensorState> out;
  for (const auto& [key, value] : state) out.emplace(key.cast<std::string>(), tensor_state_from_python(value.cast<py::dict>()));
  return out;
}

void bind_aggregation(py::module_& m) {
  py::class_<PyAggregation>(m, "Aggregation")
      .def(py::init<const std::string&>(), py::arg("spec"))
      .def_property_readonly("spec", [](const PyAggregation& a) { return a.aggregation->spec().str(); })
      .def(
          "allreduce",
          [](PyAggregation& a, at::Tensor tensor, const std::string& key, const c10d::ReduceOp& op,
             const c10::intrusive_ptr<c10d::Backend>& transport) {
            std::vector<at::Tensor> tensors = {tensor};
            c10d::AllreduceOptions opts;
            opts.reduceOp = op;
            a.aggregation->allreduce(tensors, opts, transport, a.stats, key)->wait();
          },
          py::arg("tensor"), py::arg("key"), py::arg("op"), py::arg("transport"),
          py::call_guard<py::gil_scoped_release>(),
          "Reduces `tensor` in place over `transport`; `key` names its state. Returns when done.")
      .def("state_dict", [](const PyAggregation& a) { return state_to_python(a.aggregation->state()); })
      .def("load_state_dict",
           [](PyAggregation& a, const py::dict& state) { a.aggregation->load_state(state_from_python(state)); })
      .def("tensor_state",
           [](const PyAggregation& a, const std::string& key) {
             return tensor_state_to_python(a.aggregation->tensor_state(key));
           })
      .def("set_tensor_state",
           [](PyAggregation& a, const std::string& key, const py::dict& state) {
             a.aggregation->set_tensor_state(key, tensor_state_from_python(state));
           })
      .def("stats", [](const PyAggregation& a) { return stats_to_python(a.stats); })
      .def("reset_stats", [](PyAggregation& a) { a.stats.reset(); });
}

}  // namespace gradzip::python
