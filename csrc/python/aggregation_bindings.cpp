// gradzip._C.Aggregation: the engine behind the DDP hook and the model-level API.
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>

#include "aggregate/compressed_allreduce.h"
#include "aggregate/direct_aggregation.h"
#include "aggregate/exchange.h"
#include "aggregate/node_shared_memory.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace gradzip::python {

py::dict stats_to_python(const Stats& stats) {
  const auto s = stats.snapshot();
  return py::dict(py::arg("calls") = s.calls, py::arg("bytes_sent") = s.bytes_sent,
                  py::arg("bytes_received") = s.bytes_received, py::arg("dense_bytes") = s.dense_bytes);
}

namespace {

// Its worker thread may need the GIL to finish a job (a Python callback on a future it
// completes), so the GIL is released while it is joined.
struct ReleaseGilDelete {
  void operator()(DirectAggregation* aggregation) const {
    py::gil_scoped_release no_gil;
    delete aggregation;
  }
};

using NamedPieces = std::vector<std::pair<std::string, int64_t>>;

std::vector<TensorPiece> to_pieces(const NamedPieces& pieces) {
  std::vector<TensorPiece> named;
  for (const auto& [key, numel] : pieces) named.push_back({key, numel});
  return named;
}

}  // namespace

void bind_aggregation(py::module_& m) {
  m.def(
      "exchange_plan",
      [](const BoundSpec& spec, int64_t numel, int world_size, int64_t element_size, int link_shared_by) {
        const auto codec = spec.codec();
        TORCH_CHECK(codec && !spec.decentralized(), "gradzip: '", spec.str(),
                    "' is not a compressed all-reduce; it has no exchange");
        TORCH_CHECK(numel >= 0 && world_size >= 1 && element_size >= 1 && link_shared_by >= 1,
                    "gradzip: exchange_plan needs numel >= 0, world_size >= 1, element_size >= 1 and "
                    "link_shared_by >= 1");
        // As the all-reduce plans it: a hierarchical exchange's lanes take the rounds of
        // their shared link, a flat one the spec's request.
        const int64_t requested = link_shared_by > 1 ? exchange_rounds(*codec, numel, world_size,
                                                                       rounds_request(spec.spec()), link_shared_by)
                                                     : rounds_request(spec.spec());
        const ExchangeCost cost = exchange_cost(*codec, numel, element_size, world_size, requested);
        const ExchangeScheme* choice = choose_exchange_for(*codec, exchange_request(spec.spec()), cost);
        py::dict plan(py::arg("choice") = choice ? choice->name : "dense", py::arg("dense") = cost.dense);
        for (size_t i = 0; i < exchange_schemes().size(); ++i) plan[exchange_schemes()[i]->name.c_str()] = cost.schemes[i];
        plan["rounds"] = cost.rounds;
        plan["oneshot_rounds"] = oneshot_rounds(*codec, numel, world_size, requested);
        return plan;
      },
      py::arg("spec"), py::arg("numel"), py::arg("world_size"), py::arg("element_size"),
      py::arg("link_shared_by") = 1);

  py::class_<DirectAggregation, std::unique_ptr<DirectAggregation, ReleaseGilDelete>>(m, "Aggregation")
      .def(py::init<const BoundSpec&>(), py::arg("spec"))
      .def_property_readonly("spec", [](const DirectAggregation& a) { return a.aggregation().spec(); })
      .def_property_readonly(
          "by_layers", [](const DirectAggregation& a) { return compresses_by_layers(a.aggregation().spec()); },
          "Whether tensors of pieces are compressed piece by piece (the spec's layers, auto resolved).")
      .def("allreduce", &DirectAggregation::allreduce, py::arg("tensor"), py::arg("key"), py::arg("op"),
           py::arg("transport"), py::call_guard<py::gil_scoped_release>(),
           "Reduces `tensor` in place over `transport`; `key` names its state. Returns when done.")
      .def(
          "reduce_scatter",
          [](DirectAggregation& a, const at::Tensor& output, const at::Tensor& input, const std::string& key,
             const c10d::ReduceOp& op, const c10::intrusive_ptr<c10d::Backend>& transport, const NamedPieces& pieces) {
            torch::PyWarningHandler warnings;  // a tensor that goes exact says so as a Python warning
            const auto named = to_pieces(pieces);
            try {
              py::gil_scoped_release no_gil;
              a.reduce_scatter(output, input, key, op, transport, named);
            } catch (...) {
              warnings.set_in_exception();  // the exception, not a warning turned error, reaches Python
              throw;
            }
          },
          py::arg("output"), py::arg("input"), py::arg("key"), py::arg("op"), py::arg("transport"),
          py::arg("pieces") = NamedPieces{},
          "Reduces `input` (ranks x output.numel() elements) over `transport` into this rank's chunk, "
          "`output`; `key` names its state. `pieces`: each chunk's (key, numel) pieces, compressed piece by "
          "piece with the spec's layers (empty: each chunk whole). Returns when done.")
      .def(
          "allreduce_pieces",
          [](DirectAggregation& a, const at::Tensor& tensor, const NamedPieces& pieces, const c10d::ReduceOp& op,
             const c10::intrusive_ptr<c10d::Backend>& transport) {
            const auto named = to_pieces(pieces);
            py::gil_scoped_release no_gil;
            a.allreduce_pieces(tensor, named, op, transport);
          },
          py::arg("tensor"), py::arg("pieces"), py::arg("op"), py::arg("transport"),
          "Reduces `tensor`, the concatenation of the (key, numel) pieces, in place; each piece keeps its state.")
      .def(
          "submit_pieces",
          [](DirectAggregation& a, const at::Tensor& tensor, const NamedPieces& pieces, const c10d::ReduceOp& op,
             const c10::intrusive_ptr<c10d::Backend>& transport) {
            const auto named = to_pieces(pieces);
            py::gil_scoped_release no_gil;
            return a.submit_pieces(tensor, named, op, transport);
          },
          py::arg("tensor"), py::arg("pieces"), py::arg("op"), py::arg("transport"),
          "allreduce_pieces on the aggregation's worker thread, after every call submitted before it; returns "
          "a c10d Work at once (CUDA tensors: on a side stream, after the caller's current stream).")
      .def(
          "use_node_levels",
          [](DirectAggregation& a, const c10::intrusive_ptr<c10d::Backend>& transport,
             c10::intrusive_ptr<c10d::Backend> node, c10::intrusive_ptr<c10d::Backend> lane,
             std::vector<int64_t> ranks, std::optional<std::string> shared_memory) {
            a.use_node_levels(transport, make_node_levels(node, lane, std::move(ranks), shared_memory));
          },
          py::arg("transport"), py::arg("node"), py::arg("lane"), py::arg("ranks"),
          py::arg("shared_memory") = py::none(),
          py::call_guard<py::gil_scoped_release>(),
          "Splits the ranks of `transport` into nodes for the hierarchical exchange (gradzip.node_layout); "
          "collective over the node when `shared_memory` names a shared-memory object.")
      .def("set_loss_scale", &DirectAggregation::set_loss_scale, py::arg("scale"),
           py::call_guard<py::gil_scoped_release>(),
           "The loss scale the next calls' inputs carry (GradScaler's), once every submitted call has finished: "
           "residuals are rescaled when it changes.")
      .def("state_dict", &DirectAggregation::state_dict, py::call_guard<py::gil_scoped_release>(),
           "The aggregation's state once every submitted call has finished.")
      .def("load_state_dict", &DirectAggregation::load_state_dict, py::call_guard<py::gil_scoped_release>(),
           "Restores the state once every submitted call has finished.")
      .def("stats", [](DirectAggregation& a) { return stats_to_python(a.stats()); })
      .def("reset_stats", [](DirectAggregation& a) { a.stats().reset(); });
}

}  // namespace gradzip::python
