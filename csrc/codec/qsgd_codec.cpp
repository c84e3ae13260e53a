// qsgd (Alistarh et al., 2017): per bucket of d elements with norm ‖v‖ (L2, or max),
// each element becomes sign·‖v‖·ξ/s with ξ in 0..s drawn so that E[ξ] = s·|v_i|/‖v‖:
// unbiased. The random numbers come from Philox4x32-10 keyed by the seed and counted
// by (element, step, rank), one draw per four elements: runs are reproducible and the
// ranks draw independently.
// Body: u8 code width w, u16 levels s, u8 norm (0 L2, 1 max), u32 bucket d,
// ceil(n/d) fp32 norms, then n codes of w bits: level in the low w−1 bits, sign (1 =
// negative) in the top bit.
#include <cmath>

#include "codec/bitpack.h"
#include "codec/codec_base.h"
#include "codec/philox_block.h"
#include "codec/wire.h"
#include "element_math.cuh"

namespace gradzip {
namespace {

int code_width(int levels) {
  int bits = 1;
  while ((1 << bits) - 1 < levels) ++bits;
  return bits + 1;  // + the sign bit
}

class QsgdCodec final : public CodecBase {
 public:
  QsgdCodec(int levels, int64_t bucket, bool max_norm) : levels_(levels), bucket_(bucket), max_norm_(max_norm) {}
  CodecId id() const override { return CodecId::kQsgd; }
  std::string name() const override { return "qsgd"; }
  bool biased() const override { return false; }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "qsgd");
    r.header(id(), n);
    const int width = r.get<uint8_t>("code width");
    const uint32_t levels = r.get<uint16_t>("levels");
    const uint8_t norm = r.get<uint8_t>("norm");
    const uint32_t bucket = r.get<uint32_t>("bucket");
    if (levels < 1 || levels > 32767 || width != code_width(static_cast<int>(levels))) {
      r.fail("levels " + std::to_string(levels) + " with code width " + std::to_string(width));
    }
    if (norm > 1) r.fail("unknown norm " + std::to_string(norm));
    if (bucket == 0) r.fail("bucket size 0");
    const uint64_t buckets = (static_cast<uint64_t>(n) + bucket - 1) / bucket;
    const uint8_t* norms = r.take(buckets * 4, "bucket norms");
    const uint8_t* packed = r.take(wire::bytes_for_bits(static_cast<uint64_t>(n) * width), "codes");
    r.finish();
    std::vector<uint16_t> codes(std::min<int64_t>(n, bucket));
    const uint16_t sign_bit = static_cast<uint16_t>(1u << (width - 1));
    for (uint64_t b = 0; b < buckets; ++b) {
      float bucket_norm;
      std::memcpy(&bucket_norm, norms + 4 * b, 4);
      const int64_t begin = static_cast<int64_t>(b * bucket), length = std::min<int64_t>(bucket, n - begin);
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
    const int width = code_width(levels_);
    const int64_t buckets = (n + bucket_ - 1) / bucket_;
    wire::Writer w(out);
    w.header(id(), n);
    w.put<uint8_t>(static_cast<uint8_t>(width));
    w.put<uint16_t>(static_cast<uint16_t>(levels_));
    w.put<uint8_t>(max_norm_ ? 1 : 0);
    w.put<uint32_t>(static_cast<uint32_t>(bucket_));
    const size_t norms_at = out.size();
    w.reserve(buckets * 4);
    const size_t codes_at = out.size();
    w.reserve(wire::bytes_for_bits(static_cast<uint64_t>(n) * width));
    uint8_t* norms = out.data() + norms_at;  // both after the last resize of `out`
    uint8_t* packed = out.data() + codes_at;
    const uint32_t sign_bit = 1u << (width - 1);
    uint64_t buffer = 0;  // codes stream into `packed`, little-endian, `width` bits each
    int filled = 0;
    for (int64_t b = 0; b < buckets; ++b) {
      const int64_t begin = b * bucket_, end = std::min(n, begin + bucket_);
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
  // The codes of kCount elements: level in the low bits, sign (1 = negative) on top.
  template <int kCount>
  void quantize(const float* v, float inverse, const uint32_t* random, uint32_t sign_bit, uint32_t* codes) const {
    for (int j = 0; j < kCount; ++j) codes[j] = math::qsgd_code(v[j], inverse, levels_, sign_bit, random[j]);
  }

  // ‖v‖ of one bucket: max |v_i|, or the L2 norm summed in eight float lanes (a fixed
  // order, so every machine gets the same bits, without one long chain of additions).
  float bucket_norm(const float* v, int64_t length) const {
    if (max_norm_) {
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

  // Codes [begin, begin + length) of the packed stream.
  static void unpack_bucket(const uint8_t* packed, int64_t begin, int64_t length, int width, uint16_t* codes) {
    const uint64_t first_bit = static_cast<uint64_t>(begin) * width;
    if (first_bit % 8 == 0) return bitpack::unpack_codes(packed + first_bit / 8, length, width, codes);
    const uint8_t* start = packed + first_bit / 8;
    bitpack::BitReader aligned(start, wire::bytes_for_bits(first_bit % 8 + static_cast<uint64_t>(length) * width));
    aligned.get(static_cast<int>(first_bit % 8));
    for (int64_t i = 0; i < length; ++i) codes[i] = static_cast<uint16_t>(aligned.get(width));
  }

  int levels_;
  int64_t bucket_;
  bool max_norm_;
};

}  // namespace

std::unique_ptr<Codec> make_qsgd_codec(int levels, int64_t bucket, bool max_norm) {
  return std::make_unique<QsgdCodec>(levels, bucket, max_norm);
}

}  // namespace gradzip
