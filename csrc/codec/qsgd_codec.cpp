#include <cmath>

#include "codec/bitpack.h"
#include "codec/codec_base.h"
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
    std::vector<uint16_t> codes;
    const uint16_t sign_bit = static_cast<uint16_t>(1u << (width - 1));
    for (int64_t b = from / bucket; b * bucket < to; ++b) {  // each bucket's part of [from, to)
      float bucket_norm;
      std::memcpy(&bucket_norm, norms + 4 * b, 4);
      const int64_t begin = std::max(from, b * bucket), length = std::min(to, (b + 1) * bucket) - begin;
      if (width == 4 && begin % 2 == 0) {  // whole bytes: one pass, by table
        if (!add_bucket_by_table(packed + begin / 2, length, levels, scale * bucket_norm,
                                 out + begin)) {
          r.fail("a level above " + std::to_string(levels));
        }
        continue;
      }
      codes.resize(length);
      unpack_bucket(packed, begin, length, width, codes.data());
      uint32_t highest = 0;  // checked apart from the arithmetic, so both loops vectorize
      for (int64_t i = 0; i < length; ++i) highest = std::max<uint32_t>(highest, codes[i] & (sign_bit - 1));
      if (highest > levels) r.fail("level " + std::to_string(highest) + " above " + std::to_string(levels));
      const float unit = scale * bucket_norm / static_cast<float>(levels);
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
          quantize<kPhiloxWords>(u + i, inverse, random, sign_bit, codes);  // a fixed trip count vectorizes
        } else {
          for (int j = 0; j < count; ++j) quantize<1>(u + i + j, inverse, random + j, sign_bit, codes + j);
        }
        if (filled == 0 && width == 8 && count == kPhiloxWords) {  // byte-aligned fast paths
          for (int j = 0; j < kPhiloxWords; ++j) packed[j] = static_cast<uint8_t>(codes[j]);
          packed += kPhiloxWords;
          continue;
        }
        if (filled == 0 && width == 4 && count == kPhiloxWords) {
          for (int j = 0; j < kPhiloxWords / 2; ++j) {
            packed[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
          }
          packed += kPhiloxWords / 2;
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
  // The codes of kCount elements: level in the low bits, sign (1 = negative) on top.
  template <int kCount>
  void quantize(const float* v, float inverse, const uint32_t* random, uint32_t sign_bit, uint32_t* codes) const {
    for (int j = 0; j < kCount; ++j) codes[j] = math::qsgd_code(v[j], inverse, parameters_.levels, sign_bit, random[j]);
  }

  // ‖v‖ of one bucket: max |v_i|, or the L2 norm summed in eight float lanes (a fixed
  // order, so every machine gets the same bits, without one long chain of additions).
  float bucket_norm(const float* v, int64_t length) const {
    if (parameters_.max_norm) {
      float largest = 0.0f;
      for (int64_t i = 0; i < length; ++i) largest = std::max(largest, std::fabs(v[i]));
      for (int64_t i = 0; i < length; ++i) {
        if (std::isnan(v[i])) return v[i];  // std::max drops NaN; the norm must carry it
      }
      return largest;
    }
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

  // Adds a byte-aligned bucket of 4-bit codes in one pass: each code's value (the same
  // float operations as the general path) from a table of the 16 codes. (8-bit codes
  // vectorize better through the general path.) Returns false, having added nothing,
  // when a code's level is above `levels`.
  static bool add_bucket_by_table(const uint8_t* codes, int64_t length, uint32_t levels, float norm, float* target) {
    const uint32_t sign_bit = 8;
    float table[16];
    bool invalid[16];
    for (uint32_t c = 0; c < 16; ++c) {
      const uint32_t level = c & (sign_bit - 1);
      const float magnitude = norm / static_cast<float>(levels) * static_cast<float>(level);
      table[c] = (c & sign_bit) ? -magnitude : magnitude;
      invalid[c] = level > levels;
    }
    bool bad = false;
    for (int64_t j = 0; j < length / 2; ++j) bad |= invalid[codes[j] & 0xf] | invalid[codes[j] >> 4];
    if (length % 2) bad |= invalid[codes[length / 2] & 0xf];  // the other half is not this bucket's
    if (bad) return false;
    for (int64_t j = 0; j < length / 2; ++j) {
      target[2 * j] += table[codes[j] & 0xf];
      target[2 * j + 1] += table[codes[j] >> 4];
    }
    if (length % 2) target[length - 1] += table[codes[length / 2] & 0xf];
    return true;
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
