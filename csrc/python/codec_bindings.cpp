// gradzip._C codec functions: tensors to payload bytes and back, for gradzip.codec.
#include <pybind11/stl.h>

#include "codec/lossless.h"
#include "gradzip/bound_spec.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace gradzip::python {

namespace {

// Checks encode's tensors; returns the residual's data (null without one).
float* encode_inputs(const at::Tensor& x, const BoundSpec& spec, std::optional<at::Tensor>& residual) {
  TORCH_CHECK(spec.codec(), "gradzip: '", spec.str(), "' is an aggregation without a codec");
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "gradzip: encode takes a contiguous float32 CPU tensor");
  if (!residual) return nullptr;
  TORCH_CHECK(residual->device().is_cpu() && residual->scalar_type() == at::kFloat && residual->is_contiguous() &&
                  residual->numel() == x.numel(),
              "gradzip: the residual must be a contiguous float32 CPU tensor of ", x.numel(), " elements");
  return residual->data_ptr<float>();
}

}  // namespace

void bind_codec(py::module_& m) {
  py::register_exception<PayloadError>(m, "PayloadError", PyExc_ValueError);
  m.def(
      "encode",
      [](const at::Tensor& x, const BoundSpec& spec, std::optional<at::Tensor> residual, uint64_t seed,
         uint64_t step, uint32_t rank) {
        float* e = encode_inputs(x, spec, residual);
        std::vector<uint8_t> out;
        bool finite;
        {
          py::gil_scoped_release no_gil;
          finite = encode_unless_non_finite(*spec.codec(), x.data_ptr<float>(), x.numel(), e, {seed, step, rank}, out);
        }
        return py::make_tuple(py::bytes(reinterpret_cast<const char*>(out.data()), out.size()), finite);
      },
      py::arg("x"), py::arg("spec"), py::arg("residual"), py::arg("seed"), py::arg("step"), py::arg("rank"),
      "(payload, finite): a non-finite x gives the header-only non-finite payload and leaves the residual.");
  m.def(
      "encode_into",
      [](const at::Tensor& x, const BoundSpec& spec, std::optional<at::Tensor> residual, uint64_t seed,
         uint64_t step, uint32_t rank, at::Tensor& out) {
        float* e = encode_inputs(x, spec, residual);
        const auto capacity = static_cast<int64_t>(spec.codec()->max_payload_bytes(x.numel()));
        TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kByte && out.is_contiguous(),
                    "gradzip: encode writes into a contiguous uint8 CPU tensor, not ", out.scalar_type(), " on ",
                    out.device());
        TORCH_CHECK(out.numel() >= capacity, "gradzip: a ", spec.codec()->name(), " payload of ", x.numel(),
                    " elements may take ", capacity, " bytes; `out` holds ", out.numel());
        size_t size;
        bool finite;
        {
          py::gil_scoped_release no_gil;
          size = encode_into_unless_non_finite(*spec.codec(), x.data_ptr<float>(), x.numel(), e, {seed, step, rank},
                                               out.data_ptr<uint8_t>(), static_cast<size_t>(out.numel()), finite);
        }
        return py::make_tuple(size, finite);
      },
      py::arg("x"), py::arg("spec"), py::arg("residual"), py::arg("seed"), py::arg("step"), py::arg("rank"),
      py::arg("out"), "(size, finite): encode() written at the start of `out` (uint8, max_payload_bytes at least).");
  m.def(
      "max_payload_bytes",
      [](const BoundSpec& spec, int64_t numel) {
        TORCH_CHECK(spec.codec(), "gradzip: '", spec.str(), "' is an aggregation without a codec");
        TORCH_CHECK(numel >= 0, "gradzip: max_payload_bytes needs numel >= 0, got ", numel);
        return spec.codec()->max_payload_bytes(numel);
      },
      py::arg("spec"), py::arg("numel"));
  m.def(
      "decode_add",
      [](const py::bytes& data, at::Tensor& out, float scale) {
        TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous(),
                    "gradzip: decode_add writes into a contiguous float32 CPU tensor");
        const std::string_view bytes = data;
        const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
        py::gil_scoped_release no_gil;
        decode_payload_add(p, bytes.size(), out.data_ptr<float>(), out.numel(), scale);
      },
      py::arg("data"), py::arg("out"), py::arg("scale") = 1.0f,
      "Adds scale × the payload's values to `out` (its element count must match); a non-finite payload gives NaN.");
  m.def(
      "decode_add",
      [](const at::Tensor& data, at::Tensor& out) {
        TORCH_CHECK(data.device().is_cpu() && data.scalar_type() == at::kByte && data.is_contiguous(),
                    "gradzip: a payload tensor is contiguous uint8 on the CPU, not ", data.scalar_type(), " on ",
                    data.device());
        TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous(),
                    "gradzip: decode_add writes into a contiguous float32 CPU tensor");
        py::gil_scoped_release no_gil;
        decode_payload_add(data.data_ptr<uint8_t>(), static_cast<size_t>(data.numel()), out.data_ptr<float>(),
                           out.numel());
      },
      py::arg("data"), py::arg("out"), "decode_add of a payload held in a uint8 tensor (encode's `out`).");
  m.def(
      "payload_header",
      [](const py::bytes& data) {
        const std::string_view bytes = data;
        const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
        const auto h = read_payload_header(p, bytes.size());
        return py::make_tuple(codec_for_payload(p, bytes.size())->name(), h.version, h.numel, !h.non_finite);
      },
      py::arg("data"));
  m.attr("WIRE_VERSION") = static_cast<int>(kWireVersion);
  m.def("lossless_methods", &lossless::method_names, "The lossless stages' names, in the order of their bytes.");
  m.def(
      "lossless_compress",
      [](const std::string& method, const py::bytes& data) {
        const lossless::Method m = lossless::method_from_name(method);
        const std::string_view bytes = data;
        std::vector<uint8_t> out;
        {
          py::gil_scoped_release no_gil;
          out = lossless::compress(m, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        }
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      },
      py::arg("method"), py::arg("data"), "The bytes after the lossless stage `method` (none, zstd, blosc).");
  m.def(
      "lossless_decompress",
      [](const std::string& method, const py::bytes& data, size_t raw_size) {
        const lossless::Method m = lossless::method_from_name(method);
        const std::string_view bytes = data;
        std::vector<uint8_t> out;
        {
          py::gil_scoped_release no_gil;
          out = lossless::decompress(m, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), raw_size);
        }
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      },
      py::arg("method"), py::arg("data"), py::arg("raw_size"),
      "The raw_size bytes lossless_compress() turned into `data`; PayloadError otherwise.");
}

}  // namespace gradzip::python
