#include "codec/sz_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <immintrin.h>

#include "codec/codec_base.h"
#include "codec/error_bound.h"

namespace gradzip {
namespace {

constexpr uint8_t kCoded = 0, kRaw = 1;
constexpr uint8_t kZeroPredictor = 1, kLorenzoPredictor = 2;
constexpr int64_t kRiceBlock = 4096;
constexpr int64_t kMaxCode = 1 << 16;  // |quantized error| above it: sent exactly
constexpr uint64_t kEscapeQuotient = 32;
constexpr int kRawSymbolBits = 18;     // s ≤ 2·kMaxCode + 1 < 2^18
constexpr int kMaxRiceParameter = kRawSymbolBits;

uint32_t zigzag(int64_t q) { return static_cast<uint32_t>(q < 0 ? -2 * q - 1 : 2 * q); }
int64_t unzigzag(uint32_t z) { return (z & 1) ? -static_cast<int64_t>((z + 1) / 2) : static_cast<int64_t>(z / 2); }

// The value a code reconstructs: the encoder checks it against the bound, the decoder
// writes it; both compute it the same way, so they agree on every bit.
inline float reconstruct(float prediction, int64_t q, double step) {
  return static_cast<float>(static_cast<double>(prediction) + static_cast<double>(q) * step);
}

// The bits of one block's codes with Rice parameters k, k + 1 and k + 2, in one pass
// (branch-free: it vectorizes; the same sums on every CPU).
inline void rice_costs(const uint32_t* s, int64_t count, int k, uint64_t costs[3]) {
  uint64_t a = 0, b = 0, c = 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t q0 = s[i] >> k, q1 = q0 >> 1, q2 = q0 >> 2;
    a += q0 < kEscapeQuotient ? q0 : kEscapeQuotient + kRawSymbolBits - k;
    b += q1 < kEscapeQuotient ? q1 : kEscapeQuotient + kRawSymbolBits - k - 1;
    c += q2 < kEscapeQuotient ? q2 : kEscapeQuotient + kRawSymbolBits - k - 2;
  }
  const uint64_t n = static_cast<uint64_t>(count);
  costs[0] = a + n * (1 + k), costs[1] = b + n * (2 + k), costs[2] = c + n * (3 + k);
}
__attribute__((target("avx2"))) void rice_costs_avx2(const uint32_t* s, int64_t count, int k, uint64_t costs[3]) {
  rice_costs(s, count, k, costs);
}

// The Rice parameter with the fewest bits for one block, and those bits. The cost is
// convex in k: start from `hint` (the previous block's choice) and walk downhill.
int rice_parameter(const uint32_t* s, int64_t count, int hint, bool avx2, uint64_t& best_bits) {
  int low = std::clamp(hint - 1, 0, kMaxRiceParameter - 2);  // costs of low, low + 1, low + 2
  int direction = 0;  // the first step picks it; a walk never turns back
  for (;;) {
    uint64_t costs[3];
    avx2 ? rice_costs_avx2(s, count, low, costs) : rice_costs(s, count, low, costs);
    const int best = costs[0] <= costs[1] ? (costs[0] <= costs[2] ? 0 : 2) : (costs[1] <= costs[2] ? 1 : 2);
    const int step = best == 0 && low > 0 && direction <= 0 ? -1 : best == 2 && low + 2 < kMaxRiceParameter && direction >= 0 ? 1 : 0;
    if (step == 0) {
      best_bits = costs[best];
      return low + best;
    }
    direction = step;
    low = std::clamp(low + 2 * step, 0, kMaxRiceParameter - 2);
  }
}

// The symbol of x given its prediction (0: sent exactly), and the value the decoder will
// reconstruct from it.
inline float quantize(float x, float prediction, double step, double inverse, double eb, uint32_t& symbol) {
  const double steps = (static_cast<double>(x) - static_cast<double>(prediction)) * inverse;
  symbol = 0;
  if (!(std::fabs(steps) <= static_cast<double>(kMaxCode))) return x;
  const int64_t q = static_cast<int64_t>(steps + (steps < 0.0 ? -0.5 : 0.5));  // to nearest, inlined
  const float candidate = reconstruct(prediction, q, step);
  if (!within_bound(candidate, x, eb)) return x;
  symbol = zigzag(q) + 1;
  return candidate;
}

// quantize() with prediction 0 for every element, rounding to nearest even (any rounding
// is valid: the bound is checked on the value the decoder will compute). The AVX2 path
// gives the same symbols as the scalar one.
inline uint32_t zero_predictor_symbol(float x, double step, double inverse, double eb) {
  const double steps = static_cast<double>(x) * inverse;
  if (!(std::fabs(steps) <= static_cast<double>(kMaxCode))) return 0;
  const int32_t q = static_cast<int32_t>(std::nearbyint(steps));
  const float candidate = static_cast<float>(static_cast<double>(q) * step);
  if (!within_bound(candidate, x, eb)) return 0;
  return zigzag(q) + 1;
}

__attribute__((target("avx2"))) void quantize_zero_predictor_avx2(const float* u, int64_t n, double step,
                                                                  double inverse, double eb, uint32_t* symbols) {
  const __m256d inv = _mm256_set1_pd(inverse), stp = _mm256_set1_pd(step), bound = _mm256_set1_pd(eb);
  const __m256d limit = _mm256_set1_pd(static_cast<double>(kMaxCode));
  const __m256d magnitude = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFF));
  const __m256i even_lanes = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(u + i));
    const __m256d steps = _mm256_mul_pd(x, inv);
    const __m256d small = _mm256_cmp_pd(_mm256_and_pd(steps, magnitude), limit, _CMP_LE_OQ);
    const __m256d rounded = _mm256_round_pd(_mm256_and_pd(steps, small), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i q = _mm256_cvtpd_epi32(rounded);
    const __m256d candidate = _mm256_cvtps_pd(_mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtepi32_pd(q), stp)));
    const __m256d d = _mm256_sub_pd(candidate, x);
    const __m256d ok = _mm256_and_pd(small, _mm256_and_pd(_mm256_cmp_pd(d, bound, _CMP_LE_OQ),
                                                          _mm256_cmp_pd(_mm256_sub_pd(_mm256_setzero_pd(), d), bound, _CMP_LE_OQ)));
    const __m128i ok32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(ok), even_lanes));
    const __m128i z = _mm_xor_si128(_mm_slli_epi32(q, 1), _mm_srai_epi32(q, 31));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(symbols + i), _mm_and_si128(ok32, _mm_add_epi32(z, _mm_set1_epi32(1))));
  }
  for (; i < n; ++i) symbols[i] = zero_predictor_symbol(u[i], step, inverse, eb);
}

void quantize_zero_predictor(const float* u, int64_t n, double step, double inverse, double eb, uint32_t* symbols) {
  for (int64_t i = 0; i < n; ++i) symbols[i] = zero_predictor_symbol(u[i], step, inverse, eb);
}
const bool kHasAvx2 = __builtin_cpu_supports("avx2");

struct SzLayout {
  uint8_t format;
  uint8_t predictor = 0;
  double eb = 0.0;
  uint64_t exact = 0;
  wire::Section parameters, codes, exact_values, raw;
};

SzLayout read_sz_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kSz, n);
  SzLayout layout;
  layout.format = r.get<uint8_t>("format");
  if (layout.format == kRaw) {
    layout.raw = r.take(static_cast<uint64_t>(n) * 4, "raw values");
  } else if (layout.format == kCoded) {
    layout.predictor = r.get<uint8_t>("predictor");
    if (layout.predictor != kZeroPredictor && layout.predictor != kLorenzoPredictor) {
      r.fail("unknown predictor " + std::to_string(layout.predictor));
    }
    layout.eb = r.get<double>("error bound");
    if (!(layout.eb >= 0.0) || !std::isfinite(layout.eb)) r.fail("the error bound is not a finite number ≥ 0");
    layout.exact = r.get_count("exact-value count", n);
    const uint64_t code_bytes = r.get<uint64_t>("code bytes");
    layout.parameters = r.take((static_cast<uint64_t>(n) + kRiceBlock - 1) / kRiceBlock, "Rice parameters");
    layout.codes = r.take(code_bytes, "codes");
    layout.exact_values = r.take(layout.exact * 4, "exact values");
  } else {
    r.fail("unknown format " + std::to_string(layout.format));
  }
  r.finish();
  return layout;
}

struct SzParameters {
  ErrorBoundParameters error_bound;
  int predictor = 0;  // 0 auto, else kZeroPredictor or kLorenzoPredictor
};

class SzCodec final : public ValueCodec, public WithParameters<SzParameters> {
 public:
  explicit SzCodec(const SzParameters& p) : ValueCodec(CodecId::kSz), WithParameters(p) {}
  bool biased() const override { return false; }
  size_t max_payload_bytes(int64_t n) const override { return kPayloadHeaderBytes + 1 + static_cast<size_t>(n) * 4; }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "sz");
    const SzLayout layout = read_sz_layout(r, n);
    if (layout.format == kRaw) {
      wire::add_floats(r.at(layout.raw), n, scale, out);
      return;
    }
    const uint8_t* parameters = r.at(layout.parameters);
    const uint8_t* exact = r.at(layout.exact_values);
    // The codes, padded so that a 64-bit window never reads past them.
    std::vector<uint8_t> codes(layout.codes.bytes + 16, 0);
    if (layout.codes.bytes) std::memcpy(codes.data(), r.at(layout.codes), layout.codes.bytes);
    const uint64_t limit = layout.codes.bytes * 8;
    const double step = 2.0 * layout.eb;
    const bool lorenzo = layout.predictor == kLorenzoPredictor;
    uint64_t position = 0, exact_used = 0;
    float previous = 0.0f;
    for (int64_t b = 0; b * kRiceBlock < n; ++b) {
      const int k = parameters[b];
      if (k > kMaxRiceParameter) r.fail("Rice parameter " + std::to_string(k) + " above " + std::to_string(kMaxRiceParameter));
      const uint64_t low_mask = (uint64_t{1} << k) - 1;
      for (int64_t i = b * kRiceBlock; i < std::min(n, (b + 1) * kRiceBlock); ++i) {
        if (position > limit) r.fail("the codes end before element " + std::to_string(i));
        uint64_t window;
        std::memcpy(&window, codes.data() + position / 8, 8);
        window >>= position % 8;  // at least 57 valid bits
        const uint64_t quotient = std::countr_one(window);
        uint64_t s;
        if (quotient < kEscapeQuotient) {
          s = (quotient << k) | ((window >> (quotient + 1)) & low_mask);
          position += quotient + 1 + k;
        } else if (quotient == kEscapeQuotient) {
          s = (window >> (kEscapeQuotient + 1)) & ((uint64_t{1} << kRawSymbolBits) - 1);
          position += kEscapeQuotient + 1 + kRawSymbolBits;
        } else {
          r.fail("a code of more than " + std::to_string(kEscapeQuotient) + " one-bits at element " + std::to_string(i));
        }
        float value;
        if (s == 0) {
          if (exact_used == layout.exact) r.fail("more exact values are used than the " + std::to_string(layout.exact) + " sent");
          std::memcpy(&value, exact + 4 * exact_used++, 4);
        } else {
          const int64_t q = unzigzag(static_cast<uint32_t>(s - 1));
          if (q > kMaxCode || q < -kMaxCode) r.fail("a quantized error of " + std::to_string(q) + " steps");
          value = reconstruct(lorenzo ? previous : 0.0f, q, step);
        }
        previous = value;
        out[i] += scale * value;
      }
    }
    if (position > limit) r.fail("the codes end before the last element");
    if (exact_used != layout.exact) r.fail(std::to_string(layout.exact - exact_used) + " exact values left unused");
    if ((position + 7) / 8 != layout.codes.bytes) r.fail("bytes left over after the last code");
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const override {
    const double eb = absolute_bound(parameters_.error_bound, u, n, "sz");
    const uint8_t predictor = choose_predictor(u, n);
    const bool lorenzo = predictor == kLorenzoPredictor;
    const double step = 2.0 * eb;
    const double inverse = step > 0.0 ? 1.0 / step : 0.0;
    // The symbols live in a buffer kept per thread: a fresh one per call would cost its
    // page faults each time (a model's tensors are encoded one after another).
    thread_local std::vector<uint32_t> scratch;
    if (scratch.size() < static_cast<size_t>(n)) scratch.resize(static_cast<size_t>(n));
    uint32_t* symbols = scratch.data();
    if (lorenzo) {
      float previous = 0.0f;
      for (int64_t i = 0; i < n; ++i) previous = quantize(u[i], previous, step, inverse, eb, symbols[i]);
    } else if (kHasAvx2) {
      quantize_zero_predictor_avx2(u, n, step, inverse, eb, symbols);
    } else {
      quantize_zero_predictor(u, n, step, inverse, eb, symbols);
    }
    const int64_t blocks = (n + kRiceBlock - 1) / kRiceBlock;
    std::vector<uint8_t> parameters(static_cast<size_t>(blocks));
    uint64_t total_bits = 0, exact = 0;
    int hint = 4;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kRiceBlock, count = std::min(kRiceBlock, n - begin);
      uint64_t bits;
      hint = rice_parameter(symbols + begin, count, hint, kHasAvx2, bits);
      parameters[b] = static_cast<uint8_t>(hint);
      total_bits += bits;
    }
    for (int64_t i = 0; i < n; ++i) exact += symbols[i] == 0;
    const uint64_t code_bytes = (total_bits + 7) / 8;
    wire::Writer w(out);
    w.header(id(), n);
    if (1 + 1 + 8 + 8 + 8 + parameters.size() + code_bytes + exact * 4 >= static_cast<uint64_t>(n) * 4 + 1) {
      w.put<uint8_t>(kRaw);
      w.put_floats(u, n);
      return;
    }
    w.put<uint8_t>(kCoded);
    w.put<uint8_t>(predictor);
    w.put<double>(eb);
    w.put<uint64_t>(exact);
    w.put<uint64_t>(code_bytes);
    if (!parameters.empty()) std::memcpy(w.reserve(parameters.size()), parameters.data(), parameters.size());
    // The codes go straight into the payload, then the exact values after them. Codes
    // gather in a 64-bit accumulator (at most 7 bits carried + 51 new); each step stores
    // it whole and advances by its full bytes, into 8 spare bytes at the end.
    const size_t codes_at = out.size();
    w.reserve(code_bytes + 8 + exact * 4);
    uint8_t* at = out.data() + codes_at;
    uint8_t* exact_out = out.data() + codes_at + code_bytes + 8;
    uint64_t carry = 0;
    int filled = 0;
    uint64_t taken = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int k = parameters[b];
      const uint64_t low_mask = (uint64_t{1} << k) - 1;
      for (int64_t i = b * kRiceBlock; i < std::min(n, (b + 1) * kRiceBlock); ++i) {
        const uint32_t symbol = symbols[i];
        if (symbol == 0) std::memcpy(exact_out + 4 * taken++, u + i, 4);
        // The code (first bit lowest, at most 51 bits) and its length, without branches:
        // both forms, then a select.
        const uint64_t quotient = symbol >> k;
        const bool escape = quotient >= kEscapeQuotient;
        const uint64_t plain_q = escape ? 0 : quotient;
        const uint64_t code = escape ? ((uint64_t{1} << kEscapeQuotient) - 1) | (uint64_t{symbol} << (kEscapeQuotient + 1))
                                     : ((uint64_t{1} << plain_q) - 1) | ((symbol & low_mask) << (plain_q + 1));
        carry |= code << filled;
        filled += escape ? kEscapeQuotient + 1 + kRawSymbolBits : static_cast<int>(plain_q) + 1 + k;
        std::memcpy(at, &carry, 8);
        const int bytes = filled >> 3;
        at += bytes;
        carry = bytes ? carry >> (8 * bytes) : carry;
        filled &= 7;
      }
    }
    std::memcpy(at, &carry, 8);
    // Close the 8-byte gap: the exact values follow the codes directly.
    uint8_t* codes_end = out.data() + codes_at + code_bytes;
    std::memmove(codes_end, codes_end + 8, exact * 4);
    out.resize(codes_at + code_bytes + exact * 4);
  }

 private:
  // The predictor: the spec's, or for auto the one whose prediction errors sum smaller.
  uint8_t choose_predictor(const float* u, int64_t n) const {
    if (parameters_.predictor == kZeroPredictor || parameters_.predictor == kLorenzoPredictor) {
      return static_cast<uint8_t>(parameters_.predictor);
    }
    // Up to 65536 neighbour pairs spread evenly over the tensor: enough to tell the two apart.
    const int64_t stride = std::max<int64_t>(1, n / 65536);
    double zero = 0.0, lorenzo = 0.0;
    for (int64_t i = 1; i < n; i += stride) {
      zero += std::fabs(static_cast<double>(u[i]));
      lorenzo += std::fabs(static_cast<double>(u[i]) - static_cast<double>(u[i - 1]));
    }
    return lorenzo < zero ? kLorenzoPredictor : kZeroPredictor;
  }
};

}  // namespace

const CodecRecord& sz_record() {
  static const CodecRecord record = {
      CodecId::kSz,
      "sz",
      "error-bounded quantizer (SZ-style): prediction, quantization in steps of 2·bound, Golomb-Rice codes",
      [] {
        std::vector<SpecKey> keys = error_bound_keys();
        keys.push_back(SpecKey::choice("predictor", "auto", {"auto", "zero", "lorenzo"},
                                       "zero: quantize the values; lorenzo: the differences of neighbours; "
                                       "auto: whichever predicts better"));
        return keys;
      }(),
      [](const Spec& spec) -> std::unique_ptr<Codec> {
        const std::string predictor = spec.get_string("predictor");
        return std::make_unique<SzCodec>(SzParameters{
            .error_bound = parse_error_bound(spec),
            .predictor = predictor == "zero" ? kZeroPredictor : predictor == "lorenzo" ? kLorenzoPredictor : 0});
      },
      nullptr,
  };
  return record;
}

}  // namespace gradzip
