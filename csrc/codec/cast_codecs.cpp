// identity (fp32), fp16 and bf16: every element sent, in 32 or 16 bits.
#include "codec/codec_base.h"
#include "codec/wire.h"
#include "element_math.cuh"

namespace gradzip {
namespace {

class IdentityCodec final : public CodecBase {
 public:
  CodecId id() const override { return CodecId::kIdentity; }
  std::string name() const override { return "identity"; }
  bool biased() const override { return false; }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "identity");
    r.header(id(), n);
    const uint8_t* values = r.take(static_cast<uint64_t>(n) * 4, "values");
    r.finish();
    for (int64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, values + 4 * i, 4);
      out[i] += scale * v;
    }
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const override {
    wire::Writer w(out);
    w.header(id(), n);
    std::memcpy(w.reserve(n * 4), u, n * 4);
  }
};

// Half-width floats; To16/From16 convert one element.
template <CodecId kId, uint16_t (*To16)(float), float (*From16)(uint16_t)>
class HalfCodec final : public CodecBase {
 public:
  CodecId id() const override { return kId; }
  std::string name() const override { return kId == CodecId::kFp16 ? "fp16" : "bf16"; }
  bool biased() const override { return false; }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, kId == CodecId::kFp16 ? "fp16" : "bf16");
    r.header(id(), n);
    const uint8_t* values = r.take(static_cast<uint64_t>(n) * 2, "values");
    r.finish();
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, values + 2 * i, 2);
      out[i] += scale * From16(h);
    }
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const override {
    wire::Writer w(out);
    w.header(id(), n);
    uint8_t* values = w.reserve(n * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = To16(u[i]);
      std::memcpy(values + 2 * i, &h, 2);
    }
  }
};

uint16_t to_half(float x) { return math::float_to_half(x); }
float from_half(uint16_t h) { return math::half_to_float(h); }
uint16_t to_bf16(float x) { return math::float_to_bf16(x); }
float from_bf16(uint16_t b) { return math::bf16_to_float(b); }

}  // namespace

std::unique_ptr<Codec> make_identity_codec() { return std::make_unique<IdentityCodec>(); }
std::unique_ptr<Codec> make_fp16_codec() {
  return std::make_unique<HalfCodec<CodecId::kFp16, to_half, from_half>>();
}
std::unique_ptr<Codec> make_bf16_codec() {
  return std::make_unique<HalfCodec<CodecId::kBf16, to_bf16, from_bf16>>();
}

}  // namespace gradzip
