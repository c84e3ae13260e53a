// gradzip._C.Spec and gradzip._C.ModelSpec: spec strings bound once (gradzip/bound_spec.h,
// gradzip/model_spec.h), and the registries' listings of names and keys.
#include <pybind11/stl.h>

#include "codec/codec_record.h"
#include "gradzip/aggregation.h"
#include "gradzip/model_spec.h"
#include "aggregate/compressed_allreduce.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace gradzip::python {
namespace {

py::list keys_to_python(const std::vector<SpecKey>& keys) {
  py::list out;
  for (const auto& k : keys) {
    out.append(py::dict(py::arg("name") = k.name, py::arg("default") = k.default_value,
                        py::arg("expects") = k.expects(), py::arg("help") = k.help));
  }
  return out;
}

}  // namespace

void bind_spec(py::module_& m) {
  py::register_exception<SpecError>(m, "SpecError", PyExc_ValueError);
  py::class_<BoundSpec>(m, "Spec")
      .def(py::init<std::string_view>(), py::arg("text"))
      .def("__str__", &BoundSpec::str)
      .def("__repr__", [](const BoundSpec& s) { return "gradzip.Spec('" + s.str() + "')"; })
      .def("__eq__", [](const BoundSpec& a, const BoundSpec& b) { return a.str() == b.str(); })
      .def("__hash__", [](const BoundSpec& s) { return py::hash(py::str(s.str())); })
      .def(py::pickle([](const BoundSpec& s) { return s.str(); },
                      [](const std::string& text) { return BoundSpec(text); }))
      .def_property_readonly("name", &BoundSpec::name)
      .def_property_readonly("params", [](const BoundSpec& s) { return s.spec().params; })
      .def_property_readonly("decentralized", &BoundSpec::decentralized)
      .def_property_readonly("codec",
                             [](const BoundSpec& s) -> py::object {
                               return s.codec() ? py::cast(s.codec_spec().str()) : py::none();
                             },
                             "The codec's own spec (its name and keys), or None without a codec.")
      .def_property_readonly("error_feedback",
                             [](const BoundSpec& s) -> py::object {
                               return s.spec().has("ef") ? py::cast(s.spec().get_bool("ef", false)) : py::none();
                             },
                             "The ef key, or None when the spec leaves it to the default.")
      .def_property_readonly("uses_error_feedback", &BoundSpec::error_feedback,
                             "Error feedback as every door applies it: the ef key, else the codec's default.")
      .def_property_readonly("uses_node_levels", &uses_node_levels,
                             "Whether a group's all-reduces reduce exactly inside nodes and compress across "
                             "them when its ranks sit in several nodes (hierarchy=auto).")
      .def_property_readonly("seed", [](const BoundSpec& s) -> py::object {
        return s.spec().has("seed") ? py::cast(s.spec().get_int("seed", 0)) : py::none();
      });
  // So that _C functions taking a Spec also take its text (tests, benchmarks).
  py::implicitly_convertible<py::str, BoundSpec>();
  py::class_<ModelSpec>(m, "ModelSpec", "A whole-model spec bound once: a codec spec and the model container's keys "
                                         "(gradzip/model_spec.h).")
      .def(py::init<std::string_view>(), py::arg("text"))
      .def("__str__", &ModelSpec::str)
      .def("__repr__", [](const ModelSpec& s) { return "gradzip._C.ModelSpec('" + s.str() + "')"; })
      .def_property_readonly("codec", &ModelSpec::codec, "The codec's spec (a gradzip.Spec), container keys removed.")
      .def_property_readonly("param_cutoff", &ModelSpec::param_cutoff)
      .def_property_readonly("lossless", &ModelSpec::lossless)
      .def_property_readonly("error_bound",
                             [](const ModelSpec& s) -> py::object {
                               const auto& bound = s.error_bound();
                               if (!bound) return py::none();
                               return py::make_tuple(bound->relative, bound->bound);
                             },
                             "(relative, bound) for an error-bounded codec (sz, zfp), else None.")
      .def("with_absolute_bound", &ModelSpec::with_absolute_bound, py::arg("bound"),
           "The codec's spec with mode=abs and this bound.");
  m.def("model_container_keys", [] { return keys_to_python(ModelSpec::container_keys()); });
  m.def("aggregation_kinds", [] {
    py::list out;
    for (const auto& k : aggregation_kinds()) {
      out.append(py::dict(py::arg("name") = k.name, py::arg("summary") = k.summary,
                          py::arg("keys") = keys_to_python(k.keys), py::arg("all_keys") = keys_to_python(all_keys(k)),
                          py::arg("decentralized") = k.decentralized,
                          py::arg("codec") = k.codec_from == AggregationKind::CodecFrom::kName));
    }
    return out;
  });
  m.def("codec_kinds", [] {
    py::list out;
    for (const auto* r : codec_records()) {
      out.append(py::dict(py::arg("name") = r->name, py::arg("summary") = r->summary,
                          py::arg("keys") = keys_to_python(r->keys), py::arg("device") = r->device != nullptr));
    }
    return out;
  });
}

}  // namespace gradzip::python
