// gradzip._C.Topology: the gossip graphs of gradzip/topology.h, for Python.
#include <pybind11/stl.h>

#include <ATen/ATen.h>

#include "gradzip/topology.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace gradzip::python {

void bind_topology(py::module_& m) {
  py::class_<Topology>(m, "Topology")
      .def(py::init<const std::string&, int, const std::string&, const std::string&>(), py::arg("name"),
           py::arg("size"), py::arg("weights") = "mh", py::arg("edges") = "")
      .def_property_readonly("name", &Topology::name)
      .def_property_readonly("size", &Topology::size)
      .def_property_readonly("period", &Topology::period)
      .def(
          "neighbours",
          [](const Topology& t, int rank, uint64_t step) {
            if (rank < 0 || rank >= t.size()) throw py::index_error("gradzip.Topology: rank out of range");
            std::vector<std::pair<int, double>> out;
            for (const auto& n : t.neighbours(rank, step)) out.emplace_back(n.rank, n.weight);
            return out;
          },
          py::arg("rank"), py::arg("step") = 0)
      .def(
          "self_weight",
          [](const Topology& t, int rank, uint64_t step) {
            if (rank < 0 || rank >= t.size()) throw py::index_error("gradzip.Topology: rank out of range");
            return t.self_weight(rank, step);
          },
          py::arg("rank"), py::arg("step") = 0)
      .def(
          "mixing_matrix",
          [](const Topology& t, uint64_t step) {
            auto w = t.mixing_matrix(step);
            return at::from_blob(w.data(), {t.size(), t.size()}, at::kDouble).clone();
          },
          py::arg("step") = 0)
      .def("consensus_rate", &Topology::consensus_rate)
      .def("spectral_gap", &Topology::spectral_gap);
  m.def("topology_names", &Topology::names);
}

}  // namespace gradzip::python
