// identity (fp32), fp16 and bf16: every element sent, in 32 or 16 bits. fp16 uses the
// CPU's F16C conversions when it has them (IEEE round to nearest even, the same bits as
// the scalar math), chosen at run time.
#include <immintrin.h>

#include "codec/cast_codecs.h"
#include "codec/codec_base.h"
#include "codec/element_math.cuh"
#include "codec/wire.h"

namespace gradzip {
namespace {

// A codec that sends every element: its payload is the header and the values, which
// write() puts through a wire::Writer, appended to a vector or in an exchange's slot.
class CastCodec : public ElementwiseCodec {
 public:
  using ElementwiseCodec::ElementwiseCodec;
  bool biased() const final { return false; }
  bool reencodes_losslessly() const final { return true; }
  size_t encode_into(const float* x, int64_t n, float* residual, const EncodeContext&, uint8_t* out,
                     size_t capacity) const final {
    return encode_in_place(x, n, residual, out, [&](const float* u) {
      wire::Writer w(out, capacity);
      write(u, n, w);
      return w.size();
    });
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const final {
    wire::Writer w(out);
    write(u, n, w);
  }
  virtual void write(const float* u, int64_t n, wire::Writer& w) const = 0;
};

class IdentityCodec final : public CastCodec {
 public:
  IdentityCodec() : CastCodec(CodecId::kIdentity) {}
  size_t max_payload_bytes(int64_t n) const override { return kPayloadHeaderBytes + static_cast<size_t>(n) * 4; }

  void decode_add_range(const uint8_t* data, size_t size, float* out, int64_t n, int64_t begin, int64_t end,
                        float scale) const override {
    wire::Reader r(data, size, "identity");
    wire::add_floats(r.at(read_cast_layout(r, id(), n)) + 4 * begin, end - begin, scale, out + begin);
  }

 protected:
  void write(const float* u, int64_t n, wire::Writer& w) const override {
    w.header(id(), n);
    w.put_floats(u, n);  // an empty tensor's data may be null: put_floats copies nothing then
  }
};

// Every x86-64 CPU with AVX2 has F16C (the reverse does not hold for Ivy Bridge only);
// "avx2" is a feature name every GCC and clang knows, "f16c" is not.
const bool kHasF16c = __builtin_cpu_supports("avx2");

__attribute__((target("f16c,avx"))) int64_t to_half_f16c(const float* u, int64_t n, uint8_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(u + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  return i;
}

__attribute__((target("f16c,avx"))) int64_t add_half_f16c(const uint8_t* values, int64_t n, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values + 2 * i)));
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(s, v)));
  }
  return i;
}

// Half-width floats; To16/From16 convert one element.
template <CodecId kId, uint16_t (*To16)(float), float (*From16)(uint16_t)>
class HalfCodec final : public CastCodec {
 public:
  HalfCodec() : CastCodec(kId) {}
  size_t max_payload_bytes(int64_t n) const override { return kPayloadHeaderBytes + static_cast<size_t>(n) * 2; }

  void decode_add_range(const uint8_t* data, size_t size, float* out, int64_t n, int64_t begin, int64_t end,
                        float scale) const override {
    wire::Reader r(data, size, kId == CodecId::kFp16 ? "fp16" : "bf16");
    const uint8_t* values = r.at(read_cast_layout(r, id(), n)) + 2 * begin;
    float* target = out + begin;
    const int64_t length = end - begin;
    int64_t i = kId == CodecId::kFp16 && kHasF16c ? add_half_f16c(values, length, scale, target) : 0;
    for (; i < length; ++i) {
      uint16_t h;
      std::memcpy(&h, values + 2 * i, 2);
      target[i] += scale * From16(h);
    }
  }

 protected:
  void write(const float* u, int64_t n, wire::Writer& w) const override {
    w.header(id(), n);
    uint8_t* values = w.reserve_uninitialized(n * 2);
    for (int64_t i = kId == CodecId::kFp16 && kHasF16c ? to_half_f16c(u, n, values) : 0; i < n; ++i) {
      const uint16_t h = To16(u[i]);
      std::memcpy(values + 2 * i, &h, 2);
    }
  }
};

uint16_t to_half(float x) { return math::float_to_half(x); }
float from_half(uint16_t h) { return math::half_to_float(h); }
uint16_t to_bf16(float x) { return math::float_to_bf16(x); }
float from_bf16(uint16_t b) { return math::bf16_to_float(b); }

// A record for a codec without keys or parameters.
template <CodecId kId, typename CastCodec>
CodecRecord cast_record(std::string name, std::string summary, const DeviceHalf* device) {
  return {kId,
          std::move(name),
          std::move(summary),
          {},
          [](const Spec&) -> std::unique_ptr<Codec> { return std::make_unique<CastCodec>(); },
          device};
}

}  // namespace

wire::Section read_cast_layout(wire::Reader& r, CodecId id, int64_t n) {
  r.header(id, n);
  const wire::Section values = r.take(static_cast<uint64_t>(n) * (id == CodecId::kIdentity ? 4 : 2), "values");
  r.finish();
  return values;
}

const CodecRecord& identity_record() {
  static const CodecRecord record =
      cast_record<CodecId::kIdentity, IdentityCodec>("identity", "every element as fp32 (no compression)",
                                                     GRADZIP_DEVICE_HALF(kIdentityDevice));
  return record;
}

const CodecRecord& fp16_record() {
  static const CodecRecord record = cast_record<CodecId::kFp16, HalfCodec<CodecId::kFp16, to_half, from_half>>(
      "fp16", "every element as IEEE half (2 bytes)", GRADZIP_DEVICE_HALF(kFp16Device));
  return record;
}

const CodecRecord& bf16_record() {
  static const CodecRecord record = cast_record<CodecId::kBf16, HalfCodec<CodecId::kBf16, to_bf16, from_bf16>>(
      "bf16", "every element as bfloat16 (2 bytes)", GRADZIP_DEVICE_HALF(kBf16Device));
  return record;
}

}  // namespace gradzip
