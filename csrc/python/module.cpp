// gradzip._C: bindings only. Import torch.distributed before this module, so that
// pybind11 knows c10d::Backend, the base class of gradzip.Backend.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "gradzip/aggregation.h"
#include "python/bindings.h"
#include "gradzip/build_info.h"
#include "gradzip/spec.h"

namespace py = pybind11;


PYBIND11_MODULE(_C, m) {
  m.doc() = "gradzip's C++ core";
  py::register_exception<gradzip::SpecError>(m, "SpecError", PyExc_ValueError);

  gradzip::python::bind_backend(m);
  gradzip::python::bind_aggregation(m);
  gradzip::python::bind_codec(m);
  gradzip::python::bind_topology(m);

  m.def(
      "canonical_spec",
      [](const std::string& text) {
        auto spec = gradzip::parse_spec(text);
        gradzip::make_aggregation(spec);  // checks name, keys and values
        return spec.str();
      },
      py::arg("spec"), "Parses and validates a spec; returns its canonical text or raises SpecError.");
  m.def("aggregation_kinds", [] {
    std::vector<std::tuple<std::string, std::string, std::vector<std::string>>> out;
    for (const auto& k : gradzip::aggregation_kinds()) out.emplace_back(k.name, k.summary, k.keys);
    return out;
  });
  m.def("built_torch_version", &gradzip::built_torch_version);
  m.def("cuda_built", &gradzip::cuda_built);
  m.def("cuda_architectures", &gradzip::cuda_architectures);
}
