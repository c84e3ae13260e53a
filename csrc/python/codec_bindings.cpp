// gradzip._C codec functions: tensors to payload bytes and back, for gradzip.codec.
#include <pybind11/stl.h>

#include "codec/lossless.h"
#include "codec/polar_code.h"
#include "gradzip/bound_spec.h"
#include "python/bindings.h"
#ifdef GRADZIP_WITH_CUDA
#include "aggregate/device_codec_glue.h"
#include "cuda/device_codec.h"
#endif

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
      "all_finite",
      [](const at::Tensor& x) {
        TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
                    "gradzip: all_finite takes a contiguous float32 CPU tensor");
        py::gil_scoped_release no_gil;
        return all_finite(x.data_ptr<float>(), x.numel());
      },
      py::arg("x"), "True when x holds no Inf or NaN: the check every compressed all-reduce makes first.");
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
  m.def(
      "polar_transform",
      [](const py::bytes& bits, int m) {
        std::string u = bits;
        if (m < 0 || m > polar::kMaxM || u.size() != (size_t{1} << m)) {
          throw std::invalid_argument("gradzip: polar_transform takes 2^m bytes of bits, m in [0, 20]");
        }
        polar::transform(reinterpret_cast<uint8_t*>(u.data()), m);
        return py::bytes(u);
      },
      py::arg("bits"), py::arg("m"), "x = u·F^{⊗m} over GF(2), one byte per bit (the polar codec's transform).");
  m.def(
      "polar_frozen_mask",
      [](int m, int free) {
        if (m < 0 || m > 16 || free < 0 || free > (1 << m)) {
          throw std::invalid_argument("gradzip: polar_frozen_mask takes m in [0, 16] and 0 <= free <= 2^m");
        }
        const auto mask = polar::frozen_mask(m, free);
        return py::bytes(reinterpret_cast<const char*>(mask.data()), mask.size());
      },
      py::arg("m"), py::arg("free"), "The polar codec's frozen set for 2^m bits with `free` free ones (1 = frozen).");
#ifdef GRADZIP_WITH_CUDA
  // The GPU codecs, for tests and benchmarks: the same bytes as encode()/decode_add().
  m.def(
      "cuda_encode",
      [](const at::Tensor& x, const BoundSpec& spec, std::optional<at::Tensor> residual, uint64_t seed,
         uint64_t step, uint32_t rank) {
        TORCH_CHECK(spec.codec() && cuda::has_device_half(*spec.codec()), "gradzip: '", spec.str(),
                    "' has no GPU kernels");
        return encode_on_device(*spec.codec(), x, residual ? *residual : at::Tensor(), {seed, step, rank});
      },
      py::arg("x"), py::arg("spec"), py::arg("residual"), py::arg("seed"), py::arg("step"), py::arg("rank"),
      "Encodes a float32 CUDA tensor on its GPU; returns the payload as a uint8 CUDA tensor.");
  // The payloads as rows of one uint8 CUDA tensor, each a multiple of 8 bytes long.
  const auto payload_rows = [](const std::vector<at::Tensor>& payloads, const at::Device& device) {
    int64_t stride = 8;
    for (const auto& p : payloads) stride = std::max<int64_t>(stride, (p.numel() + 7) / 8 * 8);
    auto rows = at::zeros({static_cast<int64_t>(payloads.size()), stride}, at::dtype(at::kByte).device(device));
    for (size_t r = 0; r < payloads.size(); ++r) {
      rows[static_cast<int64_t>(r)].narrow(0, 0, payloads[r].numel()).copy_(payloads[r]);
    }
    return rows;
  };
  const auto decode_rows = [](const at::Tensor& rows, const std::vector<size_t>& sizes, at::Tensor& out,
                              const BoundSpec& spec, float scale, bool set) {
    TORCH_CHECK(spec.codec() && cuda::has_device_half(*spec.codec()), "gradzip: '", spec.str(),
                "' has no GPU kernels");
    TORCH_CHECK(rows.dim() == 2 && rows.size(0) == static_cast<int64_t>(sizes.size()),
                "gradzip: the rows must be a 2-D uint8 tensor of one row per size, got ", rows.sizes());
    try {
      decode_add_on_device(spec.codec()->id(), rows.reshape({-1}), rows.size(1), sizes, out, scale, set);
    } catch (const cuda::RankPayloadError& e) {
      throw PayloadError(std::string(e.what()) + " (payload " + std::to_string(e.rank()) + ")");
    }
  };
  m.def(
      "cuda_payload_rows",
      [payload_rows](const std::vector<at::Tensor>& payloads, const at::Device& device) {
        return payload_rows(payloads, device);
      },
      py::arg("payloads"), py::arg("device"),
      "The payloads (uint8 tensors) as the zero-padded rows of one uint8 tensor on `device`, for cuda_decode_rows.");
  m.def(
      "cuda_decode_rows",
      [decode_rows](const at::Tensor& rows, const std::vector<size_t>& sizes, at::Tensor& out, const BoundSpec& spec,
                    float scale, bool set) { decode_rows(rows, sizes, out, spec, scale, set); },
      py::arg("rows"), py::arg("sizes"), py::arg("out"), py::arg("spec"), py::arg("scale") = 1.0f,
      py::arg("set") = false,
      "Adds scale × the payloads in `rows` (sizes[r] bytes of row r) into `out` (set: into zeros) on its GPU, in "
      "row order, as the exchange decodes them.");
  m.def(
      "cuda_decode_add",
      [payload_rows, decode_rows](const std::vector<at::Tensor>& payloads, at::Tensor& out, const BoundSpec& spec,
                                  float scale) {
        std::vector<size_t> sizes;
        for (const auto& p : payloads) sizes.push_back(static_cast<size_t>(p.numel()));
        decode_rows(payload_rows(payloads, out.device()), sizes, out, spec, scale, false);
      },
      py::arg("payloads"), py::arg("out"), py::arg("spec"), py::arg("scale") = 1.0f,
      "Adds scale × the payloads (uint8 CUDA tensors) into `out` on its GPU, in list order.");
#endif
}

}  // namespace gradzip::python
