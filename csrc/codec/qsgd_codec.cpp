#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec/bitpack.h"
#include "codec/codec_base.h"
#include "codec/cpu_features.h"
#include "codec/element_math.cuh"
#include "codec/philox_block.h"
#include "codec/qsgd_codec.h"

namespace gradzip {

int qsgd_code_width(int levels) {
  int bits = 1;
  while ((1 << bits) - 1 < levels) ++bits;
  return bits + 1;  // + the sign bit
}

QsgdLayout qsgd_layout(int64_t n, int levels, bool max_norm, int64_t bucket) {
  QsgdLayout layout;
  layout.width = qsgd_code_width(levels);
  layout.levels = static_cast<uint32_t>(levels);
  layout.max_norm = max_norm;
  layout.bucket = static_cast<uint32_t>(bucket);
  layout.buckets = (static_cast<uint64_t>(n) + layout.bucket - 1) / layout.bucket;
  layout.norms = {kPayloadHeaderBytes + 8, layout.buckets * 4};
  layout.codes = {layout.norms.offset + layout.norms.bytes,
                  wire::bytes_for_bits(static_cast<uint64_t>(n) * static_cast<uint64_t>(layout.width))};
  layout.bytes = layout.codes.offset + layout.codes.bytes;
  return layout;
}

void write_qsgd_fields(wire::Writer& w, int64_t n, const QsgdLayout& layout) {
  w.header(CodecId::kQsgd, static_cast<uint64_t>(n));
  w.put<uint8_t>(static_cast<uint8_t>(layout.width));
  w.put<uint16_t>(static_cast<uint16_t>(layout.levels));
  w.put<uint8_t>(layout.max_norm ? 1 : 0);
  w.put<uint32_t>(layout.bucket);
}

QsgdLayout read_qsgd_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kQsgd, n);
  const uint8_t width = r.get<uint8_t>("code width");
  const uint16_t levels = r.get<uint16_t>("levels");
  const uint8_t norm = r.get<uint8_t>("norm");
  const uint32_t bucket = r.get<uint32_t>("bucket");
  if (levels < 1 || levels > kMaxBudgetLevels || width != qsgd_code_width(levels)) {
    r.fail("levels " + std::to_string(levels) + " with code width " + std::to_string(width));
  }
  if (norm > 1) r.fail("unknown norm " + std::to_string(norm));
  if (bucket == 0) r.fail("bucket size 0");
  const QsgdLayout layout = qsgd_layout(n, levels, norm == 1, bucket);
  r.take(layout.norms.bytes, "bucket norms");
  r.take(layout.codes.bytes, "codes");
  r.finish();
  return layout;
}

namespace {

// out[i] += unit × level_i, negated where the sign bit is set, for the first elements of
// `n` whose codes (`width` bits each, sign on top, from a byte boundary) are in whole
// groups of eight with 16 readable bytes at `bytes` from `packed`: the scalar loop's
// float operations, eight lanes at a time. Raises `highest` to the greatest level seen
// and returns the elements added (a multiple of 8).
__attribute__((target("avx2"))) int64_t add_codes_avx2(const uint8_t* packed, uint64_t bytes, int64_t n, int width,
                                                       float unit, float* out, uint32_t& highest) {
  // Lane j's code starts at bit j·width of the group: its three bytes from byte
  // j·width / 8 (pshufb, within each 128-bit half, both holding the group's 16 bytes),
  // shifted right by j·width % 8 (at most 7 + 16 bits: within 24).
  alignas(32) uint8_t shuffle[32];
  alignas(32) uint32_t shift[8];
  for (int j = 0; j < 8; ++j) {
    const int bit = j * width;
    for (int k = 0; k < 4; ++k) {  // 0x80: a zero byte (the group's 16 bytes hold every code's bits)
      shuffle[4 * j + k] = k < 3 && bit / 8 + k < 16 ? static_cast<uint8_t>(bit / 8 + k) : 0x80;
    }
    shift[j] = static_cast<uint32_t>(bit % 8);
  }
  const __m256i bytes_of_lane = _mm256_load_si256(reinterpret_cast<const __m256i*>(shuffle));
  const __m256i shifts = _mm256_load_si256(reinterpret_cast<const __m256i*>(shift));
  const __m256i level_mask = _mm256_set1_epi32((1 << (width - 1)) - 1);
  const __m128i sign_to_top = _mm_cvtsi32_si128(32 - width);  // the code's top bit to the float's sign
  const __m256i sign_mask = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256 vunit = _mm256_set1_ps(unit);
  __m256i most = _mm256_setzero_si256();
  const int64_t groups = std::min<int64_t>(n / 8, bytes >= 16 ? static_cast<int64_t>((bytes - 16) / width + 1) : 0);
  for (int64_t g = 0; g < groups; ++g) {
    const __m128i group = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + g * width));
    const __m256i lanes = _mm256_srlv_epi32(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(group), bytes_of_lane), shifts);
    const __m256i level = _mm256_and_si256(lanes, level_mask);
    const __m256i sign = _mm256_and_si256(_mm256_sll_epi32(lanes, sign_to_top), sign_mask);
    most = _mm256_max_epu32(most, level);
    const __m256 magnitude = _mm256_mul_ps(vunit, _mm256_cvtepi32_ps(level));
    const __m256 value = _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign));
    _mm256_storeu_ps(out + 8 * g, _mm256_add_ps(_mm256_loadu_ps(out + 8 * g), value));
  }
  alignas(32) uint32_t lanes_most[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_most), most);
  for (const uint32_t level : lanes_most) highest = std::max(highest, level);
  return 8 * groups;
}

// The codes of kPhiloxWords elements (level in the low bits, sign, 1 = negative, on
// top) and a bucket's L2 norm, each compiled for the baseline (four lanes) and for AVX2
// (eight): the same operations per element and per lane (AVX2 brings no FMA), so the same
// bits. The norm sums v_i² in eight float lanes (lane i % 8), then the lanes in order in
// double: a fixed order, so every machine gets the same bits.
[[gnu::always_inline]] inline void quantize_words_body(const float* __restrict v, float inverse, uint32_t levels,
                                                       const uint32_t* __restrict random, uint32_t sign_bit,
                                                       uint32_t* __restrict codes) {
  for (int j = 0; j < kPhiloxWords; ++j) codes[j] = math::qsgd_code(v[j], inverse, levels, sign_bit, random[j]);
}
[[gnu::always_inline]] inline float l2_norm_body(const float* __restrict v, int64_t length) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= length; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += v[i + j] * v[i + j];
  }
  for (; i < length; ++i) lanes[0] += v[i] * v[i];
  double total = 0.0;
  for (float lane : lanes) total += lane;
  return static_cast<float>(std::sqrt(total));
}
void quantize_words_baseline(const float* v, float inverse, uint32_t levels, const uint32_t* random, uint32_t sign_bit,
                             uint32_t* codes) {
  quantize_words_body(v, inverse, levels, random, sign_bit, codes);
}
__attribute__((target("avx2"))) void quantize_words_avx2(const float* v, float inverse, uint32_t levels,
                                                         const uint32_t* random, uint32_t sign_bit, uint32_t* codes) {
  quantize_words_body(v, inverse, levels, random, sign_bit, codes);
}
float l2_norm_baseline(const float* v, int64_t length) { return l2_norm_body(v, length); }
__attribute__((target("avx2"))) float l2_norm_avx2(const float* v, int64_t length) { return l2_norm_body(v, length); }

class QsgdCodec final : public ElementwiseCodec, public WithParameters<QsgdParameters> {
 public:
  explicit QsgdCodec(const QsgdParameters& p) : ElementwiseCodec(CodecId::kQsgd), WithParameters(p) {}
  bool biased() const override { return false; }
  Budget budget() const override { return {BudgetKind::kLevels, static_cast<double>(parameters_.levels)}; }
  std::unique_ptr<Codec> with_budget(double levels) const override {
    if (!(levels >= 1 && levels <= kMaxBudgetLevels) || levels != std::floor(levels)) {
      throw std::invalid_argument("gradzip: qsgd's levels must be a whole number in [1, " +
                                  std::to_string(kMaxBudgetLevels) + "], not " + std::to_string(levels));
    }
    QsgdParameters p = parameters_;
    p.levels = static_cast<int>(levels);
    return std::make_unique<QsgdCodec>(p);
  }
  size_t max_payload_bytes(int64_t n) const override { return layout_for(n).bytes; }

  void decode_add_range(const uint8_t* data, size_t size, float* out, int64_t n, int64_t from, int64_t to,
                        float scale) const override {
    wire::Reader r(data, size, "qsgd");
    const QsgdLayout layout = read_qsgd_layout(r, n);
    const int width = layout.width;
    const uint32_t levels = layout.levels;
    const int64_t bucket = layout.bucket;
    const uint8_t* norms = r.at(layout.norms);
    const uint8_t* packed = r.at(layout.codes);
    thread_local std::vector<uint16_t> codes;
    const uint16_t sign_bit = static_cast<uint16_t>(1u << (width - 1));
    for (int64_t b = from / bucket; b * bucket < to; ++b) {  // each bucket's part of [from, to)
      float bucket_norm;
      std::memcpy(&bucket_norm, norms + 4 * b, 4);
      const float unit = scale * bucket_norm / static_cast<float>(levels);
      int64_t begin = std::max(from, b * bucket);
      const int64_t end = std::min(to, (b + 1) * bucket);
      uint32_t highest = 0;  // checked apart from the arithmetic, so the loops vectorize
      const uint64_t first_bit = static_cast<uint64_t>(begin) * width;
      if (kHasAvx2 && first_bit % 8 == 0) {
        begin += add_codes_avx2(packed + first_bit / 8, layout.codes.bytes - first_bit / 8, end - begin, width, unit,
                                out + begin, highest);
      }
      const int64_t length = end - begin;
      codes.resize(length);
      unpack_bucket(packed, begin, length, width, codes.data());
      for (int64_t i = 0; i < length; ++i) highest = std::max<uint32_t>(highest, codes[i] & (sign_bit - 1));
      if (highest > levels) r.fail("level " + std::to_string(highest) + " above " + std::to_string(levels));
      float* target = out + begin;
      for (int64_t i = 0; i < length; ++i) {
        const float magnitude = unit * static_cast<float>(codes[i] & (sign_bit - 1));
        target[i] += (codes[i] & sign_bit) ? -magnitude : magnitude;
      }
    }
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext& ctx, std::vector<uint8_t>& out) const override {
    const QsgdLayout layout = layout_for(n);
    const int width = layout.width;
    const auto buckets = static_cast<int64_t>(layout.buckets);
    const size_t start = out.size();
    wire::Writer w(out);
    write_qsgd_fields(w, n, layout);
    w.reserve(layout.norms.bytes + layout.codes.bytes);
    uint8_t* norms = out.data() + start + layout.norms.offset;  // both after the last resize of `out`
    uint8_t* packed = out.data() + start + layout.codes.offset;
    const uint32_t sign_bit = 1u << (width - 1);
    const auto levels = static_cast<uint32_t>(parameters_.levels);
    uint64_t buffer = 0;  // codes stream into `packed`, little-endian, `width` bits each
    int filled = 0;
    for (int64_t b = 0; b < buckets; ++b) {
      const int64_t begin = b * parameters_.bucket, end = std::min(n, begin + parameters_.bucket);
      const float norm = bucket_norm(u + begin, end - begin);
      std::memcpy(norms + 4 * b, &norm, 4);
      const float inverse = norm > 0.0f ? 1.0f / norm : 0.0f;
      uint32_t random[kPhiloxWords];
      uint32_t codes[kPhiloxWords];
      for (int64_t i = begin; i < end; i += kPhiloxWords) {
        philox_words(static_cast<uint64_t>(i), static_cast<uint32_t>(ctx.step), ctx.rank, ctx.seed, random);
        const int count = static_cast<int>(std::min<int64_t>(kPhiloxWords, end - i));
        if (count == kPhiloxWords) {
          (kHasAvx2 ? quantize_words_avx2 : quantize_words_baseline)(u + i, inverse, levels, random, sign_bit, codes);
        } else {
          for (int j = 0; j < count; ++j) codes[j] = math::qsgd_code(u[i + j], inverse, levels, sign_bit, random[j]);
        }
        if (filled == 0 && count == kPhiloxWords) {  // whole bytes: eight codes at a time
          bitpack::pack_code_groups(codes, kPhiloxWords, width, packed);
          packed += kPhiloxWords / 8 * width;
          continue;
        }
        for (int j = 0; j < count; ++j) {
          buffer |= static_cast<uint64_t>(codes[j]) << filled;
          filled += width;
          while (filled >= 8) {
            *packed++ = static_cast<uint8_t>(buffer);
            buffer >>= 8;
            filled -= 8;
          }
        }
      }
    }
    if (filled > 0) *packed = static_cast<uint8_t>(buffer);
  }

 private:
  QsgdLayout layout_for(int64_t n) const { return qsgd_layout(n, parameters_.levels, parameters_.max_norm, parameters_.bucket); }
  // ‖v‖ of one bucket: max |v_i|, or the L2 norm in eight float lanes (l2_norm_body).
  float bucket_norm(const float* v, int64_t length) const {
    if (parameters_.max_norm) {
      float largest = 0.0f;
      for (int64_t i = 0; i < length; ++i) largest = std::max(largest, std::fabs(v[i]));
      for (int64_t i = 0; i < length; ++i) {
        if (std::isnan(v[i])) return v[i];  // std::max drops NaN; the norm must carry it
      }
      return largest;
    }
    return kHasAvx2 ? l2_norm_avx2(v, length) : l2_norm_baseline(v, length);
  }

  // Codes [begin, begin + length) of the packed stream.
  static void unpack_bucket(const uint8_t* packed, int64_t begin, int64_t length, int width, uint16_t* codes) {
    const uint64_t first_bit = static_cast<uint64_t>(begin) * width;
    if (first_bit % 8 == 0) return bitpack::unpack_codes(packed + first_bit / 8, length, width, codes);
    const uint8_t* start = packed + first_bit / 8;
    bitpack::BitReader aligned(start, wire::bytes_for_bits(first_bit % 8 + static_cast<uint64_t>(length) * width));
    aligned.get(static_cast<int>(first_bit % 8));
    for (int64_t i = 0; i < length; ++i) codes[i] = static_cast<uint16_t>(aligned.get(width));
  }
};

}  // namespace

const QsgdParameters& qsgd_parameters(const Codec& codec) { return parameters_of<QsgdParameters>(codec); }

const CodecRecord& qsgd_record() {
  static const CodecRecord record = {
      CodecId::kQsgd,
      "qsgd",
      "stochastic quantization to s levels per bucket: bits (incl. sign) or levels, bucket, norm=l2|max",
      {SpecKey::integer("bits", "4", 2, 16, "bits per element, the sign included: s = 2^(bits-1) - 1 levels"),
       SpecKey::integer("levels", "", 1, kMaxBudgetLevels, "the number of levels s, instead of bits (levels=1, norm=max: TernGrad)"),
       SpecKey::integer("bucket", "512", 1, 1 << 30, "elements per norm"),
       SpecKey::choice("norm", "l2", {"l2", "max"}, "the bucket norm the levels divide")},
      [](const Spec& spec) -> std::unique_ptr<Codec> {
        if (spec.has("bits") && spec.has("levels")) {
          throw SpecError("gradzip: spec '" + spec.str() + "': give bits or levels, not both");
        }
        QsgdParameters p;
        p.levels = spec.has("levels") ? static_cast<int>(spec.get_int("levels"))
                                      : static_cast<int>((int64_t{1} << (spec.get_int("bits") - 1)) - 1);
        p.bucket = spec.get_int("bucket");
        p.max_norm = spec.get_string("norm") == "max";
        return std::make_unique<QsgdCodec>(p);
      },
      GRADZIP_DEVICE_HALF(kQsgdDevice),
  };
  return record;
}

}  // namespace gradzip
