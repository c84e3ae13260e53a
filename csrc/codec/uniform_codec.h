// uniform: TensorFlow Federated's 8-bit rule for federated averaging (McMahan et al.'s
// FedAvg with TFF's uniform quantization): a tensor of more than `threshold` elements
// (default 10000) is quantized to `bits` bits (default 8) between its min and max, with
// stochastic rounding drawn from (seed, step, rank, element) (rounding=nearest rounds
// instead); smaller tensors travel as fp32. The spec `uniform` alone is TFF's rule.
//
// Body: u8 format (0 quantized, 1 raw floats).
//   raw:       n fp32.
//   quantized: u8 bits, fp32 min, fp32 max, ceil(n × bits / 8) bytes of codes, element i
//              at bit offset i × bits. Code c decodes to min + c × step, step =
//              (max − min) / (2^bits − 1), both in fp64, rounded to fp32 once.
#pragma once

#include "codec/codec_record.h"
#include "codec/wire.h"

namespace gradzip {

struct UniformParameters {
  int bits = 0;                     // per element
  int64_t threshold = 0;            // tensors of at most this many elements go as fp32
  bool stochastic_rounding = true;  // rounding=stochastic (else nearest)
};
// The parameters of a uniform codec (std::logic_error for another codec).
const UniformParameters& uniform_parameters(const Codec& codec);

constexpr uint8_t kUniformQuantized = 0, kUniformRaw = 1;

struct UniformLayout {
  uint8_t format;
  int bits = 0;
  float low = 0.0f, high = 0.0f;
  wire::Section extremes, codes, raw;  // extremes: low and high, f32 each (quantized)
  uint64_t bytes = 0;                  // the whole payload's
};
// The layout of a uniform payload of n elements: what the CPU and CUDA writers lay out
// and the reader checks (bits, low and high for kUniformQuantized only).
UniformLayout uniform_layout(int64_t n, uint8_t format, int bits, float low, float high);
// The header and fixed fields of a payload laid out so (both writers).
void write_uniform_fields(wire::Writer& w, int64_t n, const UniformLayout& layout);
// The one parser of a uniform payload's layout (CPU decoder and CUDA dispatch). Throws PayloadError.
UniformLayout read_uniform_layout(wire::Reader& r, int64_t n);

const CodecRecord& uniform_record();
extern const DeviceHalf kUniformDevice;  // cuda/uniform.cu: 8-bit codes and the fp32 path

}  // namespace gradzip
