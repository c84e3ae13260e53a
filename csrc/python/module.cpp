// gradzip._C: bindings only. Import torch.distributed before this module, so that
// pybind11 knows c10d::Backend, the base class of gradzip.Backend.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "gradzip/aggregation.h"
#include "gradzip/backend.h"
#include "gradzip/build_info.h"
#include "gradzip/spec.h"

namespace py = pybind11;

namespace {

// Holds a Backend for Python and drops it without the GIL: destroying the inner Gloo
// backend joins its worker threads, which may need the GIL to free the tensors of
// finished work; holding it here would deadlock. Same layout as c10::intrusive_ptr,
// which pybind11 relies on when it hands the object to torch as a c10d::Backend.
template <typename T>
class GilFreeDestructorPtr {
 public:
  GilFreeDestructorPtr() = default;
  explicit GilFreeDestructorPtr(T* raw) : impl_(c10::intrusive_ptr<T>::unsafe_reclaim_from_nonowning(raw)) {}
  GilFreeDestructorPtr(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}  // NOLINT: pybind11 converts
  GilFreeDestructorPtr(const GilFreeDestructorPtr&) = default;
  GilFreeDestructorPtr& operator=(const GilFreeDestructorPtr&) = default;
  ~GilFreeDestructorPtr() {
    if (impl_ && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      impl_.reset();
    }
  }
  T* get() const { return impl_.get(); }

 private:
  c10::intrusive_ptr<T> impl_;
};
static_assert(sizeof(GilFreeDestructorPtr<gradzip::Backend>) == sizeof(c10::intrusive_ptr<gradzip::Backend>));

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, GilFreeDestructorPtr<T>, true)

PYBIND11_MODULE(_C, m) {
  m.doc() = "gradzip's C++ core";
  py::register_exception<gradzip::SpecError>(m, "SpecError", PyExc_ValueError);

  py::class_<gradzip::Backend, c10d::Backend, GilFreeDestructorPtr<gradzip::Backend>>(m, "Backend")
      .def(py::init([](int rank, int size, c10::intrusive_ptr<c10d::Backend> cpu_transport,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> cuda_transport, const std::string& spec,
                       bool validate, std::chrono::milliseconds timeout) {
             return GilFreeDestructorPtr<gradzip::Backend>(c10::make_intrusive<gradzip::Backend>(
                 rank, size, std::move(cpu_transport), cuda_transport.value_or(nullptr),
                 gradzip::parse_spec(spec), validate, timeout));
           }),
           py::arg("rank"), py::arg("size"), py::arg("cpu_transport"), py::arg("cuda_transport"),
           py::arg("spec"), py::arg("validate"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("spec", [](const gradzip::Backend& b) { return b.aggregation().spec().str(); })
      .def_property_readonly("validates", &gradzip::Backend::validates)
      .def_property_readonly("has_cuda_transport", &gradzip::Backend::has_cuda_transport)
      .def("stats",
           [](gradzip::Backend& b) {
             const auto s = b.stats().snapshot();
             return py::dict(py::arg("calls") = s.calls, py::arg("bytes_sent") = s.bytes_sent,
                             py::arg("bytes_received") = s.bytes_received, py::arg("dense_bytes") = s.dense_bytes);
           })
      .def("reset_stats", [](gradzip::Backend& b) { b.stats().reset(); });

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
