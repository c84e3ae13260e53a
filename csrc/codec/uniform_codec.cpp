#include "codec/uniform_codec.h"

#include <cmath>
#include <cstring>

#include "codec/bitpack.h"
#include "codec/codec_base.h"
#include "codec/element_math.cuh"
#include "codec/philox_block.h"
#include "codec/wire.h"

namespace gradzip {

UniformLayout uniform_layout(int64_t n, uint8_t format, int bits, float low, float high) {
  UniformLayout layout;
  layout.format = format;
  if (format == kUniformRaw) {
    layout.raw = {kPayloadHeaderBytes + 1, static_cast<uint64_t>(n) * 4};
    layout.bytes = layout.raw.offset + layout.raw.bytes;
    return layout;
  }
  layout.bits = bits;
  layout.low = low;
  layout.high = high;
  layout.extremes = {kPayloadHeaderBytes + 2, 8};
  layout.codes = {layout.extremes.offset + layout.extremes.bytes,
                  wire::bytes_for_bits(static_cast<uint64_t>(n) * static_cast<uint64_t>(bits))};
  layout.bytes = layout.codes.offset + layout.codes.bytes;
  return layout;
}

void write_uniform_fields(wire::Writer& w, int64_t n, const UniformLayout& layout) {
  w.header(CodecId::kUniform, static_cast<uint64_t>(n));
  w.put<uint8_t>(layout.format);
  if (layout.format == kUniformRaw) return;
  w.put<uint8_t>(static_cast<uint8_t>(layout.bits));
  w.put<float>(layout.low);
  w.put<float>(layout.high);
}

UniformLayout read_uniform_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kUniform, n);
  const uint8_t format = r.get<uint8_t>("format");
  UniformLayout layout;
  if (format == kUniformRaw) {
    layout = uniform_layout(n, format, 0, 0.0f, 0.0f);
    r.take(layout.raw.bytes, "raw values");
  } else if (format == kUniformQuantized) {
    const int bits = r.get<uint8_t>("bits");
    if (bits < 1 || bits > 16) r.fail("bits = " + std::to_string(bits) + ", valid 1..16");
    const auto low = r.get<float>("min");
    const auto high = r.get<float>("max");
    if (!std::isfinite(low) || !std::isfinite(high) || low > high) r.fail("min and max are not finite with min ≤ max");
    layout = uniform_layout(n, format, bits, low, high);
    r.take(layout.codes.bytes, "codes");
  } else {
    r.fail("unknown format " + std::to_string(format));
  }
  r.finish();
  return layout;
}

namespace {

class UniformCodec final : public ValueCodec, public WithParameters<UniformParameters> {
 public:
  explicit UniformCodec(const UniformParameters& p) : ValueCodec(CodecId::kUniform), WithParameters(p) {}
  bool biased() const override { return !parameters_.stochastic_rounding; }
  size_t max_payload_bytes(int64_t n) const override {
    return layout_for(n, 0.0f, 0.0f).bytes;
  }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "uniform");
    const UniformLayout layout = read_uniform_layout(r, n);
    if (layout.format == kUniformRaw) {
      wire::add_floats(r.at(layout.raw), n, scale, out);
      return;
    }
    const double step = math::uniform_step(layout.low, layout.high, layout.bits);
    const uint8_t* codes = r.at(layout.codes);
    if (layout.bits == 8) {
      for (int64_t i = 0; i < n; ++i) out[i] += scale * math::uniform_level(layout.low, codes[i], step);
      return;
    }
    uint16_t unpacked[1024];
    for (int64_t begin = 0; begin < n; begin += 1024) {  // 1024 codes end on a byte boundary
      const int64_t count = std::min<int64_t>(1024, n - begin);
      bitpack::unpack_codes(codes + begin / 8 * layout.bits, count, layout.bits, unpacked);
      for (int64_t j = 0; j < count; ++j) {
        out[begin + j] += scale * math::uniform_level(layout.low, unpacked[j], step);
      }
    }
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext& ctx, std::vector<uint8_t>& out) const override {
    const int bits = parameters_.bits;
    if (!all_finite(u, n)) throw std::invalid_argument("gradzip: uniform: the tensor holds Inf or NaN");
    float low = n ? u[0] : 0.0f, high = low;
    for (int64_t i = 0; i < n; ++i) {
      low = u[i] < low ? u[i] : low;
      high = u[i] > high ? u[i] : high;
    }
    low = math::uniform_extreme(low);
    high = math::uniform_extreme(high);
    const UniformLayout layout = layout_for(n, low, high);
    wire::Writer w(out);
    write_uniform_fields(w, n, layout);
    if (layout.format == kUniformRaw) {
      w.put_floats(u, n);
      return;
    }
    const double step = math::uniform_step(low, high, bits);
    const double inverse = step > 0.0 ? 1.0 / step : 0.0;
    const uint32_t top = (uint32_t{1} << bits) - 1;
    uint8_t* packed = w.reserve(layout.codes.bytes);
    std::vector<uint8_t> stream;
    bitpack::BitWriter writer(stream);
    uint32_t random[kPhiloxWords];
    for (int64_t begin = 0; begin < n; begin += kPhiloxWords) {
      const int count = static_cast<int>(std::min<int64_t>(kPhiloxWords, n - begin));
      if (parameters_.stochastic_rounding) {
        philox_words(static_cast<uint64_t>(begin), static_cast<uint32_t>(ctx.step), ctx.rank, ctx.seed, random);
      }
      for (int j = 0; j < count; ++j) {
        const double up = parameters_.stochastic_rounding ? math::uniform01(random[j]) : 0.5;
        const uint32_t c = math::uniform_code(u[begin + j], low, inverse, top, up);
        if (bits == 8) {
          packed[begin + j] = static_cast<uint8_t>(c);
        } else {
          writer.put(c, bits);
        }
      }
    }
    if (bits != 8) {
      writer.flush();
      std::memcpy(packed, stream.data(), stream.size());
    }
  }

 private:
  // The layout of n elements: fp32 up to the threshold, else `bits` per element.
  UniformLayout layout_for(int64_t n, float low, float high) const {
    return uniform_layout(n, n <= parameters_.threshold ? kUniformRaw : kUniformQuantized, parameters_.bits, low, high);
  }
};

}  // namespace

const UniformParameters& uniform_parameters(const Codec& codec) { return parameters_of<UniformParameters>(codec); }

const CodecRecord& uniform_record() {
  static const CodecRecord record = {
      CodecId::kUniform,
      "uniform",
      "TFF's 8-bit rule: min–max uniform quantization with stochastic rounding above a size threshold, fp32 below",
      {SpecKey::integer("bits", "8", 1, 16, "bits per element"),
       SpecKey::integer("threshold", "10000", 0, 1e18, "tensors of at most this many elements travel as fp32"),
       SpecKey::choice("rounding", "stochastic", {"stochastic", "nearest"},
                       "stochastic: unbiased, drawn from (seed, step, rank, element); nearest: deterministic")},
      [](const Spec& spec) -> std::unique_ptr<Codec> {
        return std::make_unique<UniformCodec>(
            UniformParameters{.bits = static_cast<int>(spec.get_int("bits")),
                              .threshold = spec.get_int("threshold"),
                              .stochastic_rounding = spec.get_string("rounding") == "stochastic"});
      },
      GRADZIP_DEVICE_HALF(kUniformDevice),
  };
  return record;
}

}  // namespace gradzip
