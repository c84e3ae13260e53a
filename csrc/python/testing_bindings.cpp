// gradzip._C.testing: kernels bound for gradzip's own tests and benchmarks (the
// non-finite check, the polar code's transform and frozen set, the GPU codecs on their
// own), not an API: gradzip's modules do not call them.
#include <pybind11/stl.h>

#include "codec/payload_padding.h"
#include "codec/polar_code.h"
#include "gradzip/bound_spec.h"
#include "gradzip/codec.h"
#include "python/bindings.h"
#ifdef GRADZIP_WITH_CUDA
#include "aggregate/device_slot_codec.h"
#include "cuda/device_codec.h"
#endif

namespace py = pybind11;

namespace gradzip::python {

void bind_testing(py::module_& m) {
  py::module_ t = m.def_submodule("testing", "Kernels bound for gradzip's tests and benchmarks; not an API.");
  t.def(
      "all_finite",
      [](const at::Tensor& x) {
        TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
                    "gradzip: all_finite takes a contiguous float32 CPU tensor");
        py::gil_scoped_release no_gil;
        return all_finite(x.data_ptr<float>(), x.numel());
      },
      py::arg("x"), "True when x holds no Inf or NaN: the check every compressed all-reduce makes first.");
  t.def(
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
  t.def(
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
  t.def(
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
    int64_t stride = padded_payload_bytes(0);
    for (const auto& p : payloads) stride = std::max(stride, padded_payload_bytes(p.numel()));
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
  t.def(
      "cuda_payload_rows",
      [payload_rows](const std::vector<at::Tensor>& payloads, const at::Device& device) {
        return payload_rows(payloads, device);
      },
      py::arg("payloads"), py::arg("device"),
      "The payloads (uint8 tensors) as the zero-padded rows of one uint8 tensor on `device`, for cuda_decode_rows.");
  t.def(
      "cuda_decode_rows",
      [decode_rows](const at::Tensor& rows, const std::vector<size_t>& sizes, at::Tensor& out, const BoundSpec& spec,
                    float scale, bool set) { decode_rows(rows, sizes, out, spec, scale, set); },
      py::arg("rows"), py::arg("sizes"), py::arg("out"), py::arg("spec"), py::arg("scale") = 1.0f,
      py::arg("set") = false,
      "Adds scale × the payloads in `rows` (sizes[r] bytes of row r) into `out` (set: into zeros) on its GPU, in "
      "row order, as the exchange decodes them.");
  t.def(
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
