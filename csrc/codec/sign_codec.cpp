// sign: one bit per element (1 = non-negative, so +0 and +NaN vote +1). With block > 0
// (EF-SignSGD, Karimireddy et al. 2019) each block of `block` elements also carries its
// scale ‖u_block‖₁ / |block| and decodes to ±scale; with block = 0 (signSGD, Bernstein
// et al. 2018) it decodes to ±1, for majority vote.
// Body: u32 block, ceil(n/block) fp32 scales (block > 0 only), ceil(n/8) bytes of bits.
#include <cmath>

#include "codec/bitpack.h"
#include "codec/codec_base.h"
#include "codec/wire.h"

namespace gradzip {
namespace {

class SignCodec final : public CodecBase {
 public:
  explicit SignCodec(int64_t block) : block_(block) {}
  CodecId id() const override { return CodecId::kSign; }
  std::string name() const override { return "sign"; }
  bool biased() const override { return true; }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "sign");
    r.header(id(), n);
    const uint32_t block = r.get<uint32_t>("block");
    const uint64_t blocks = block ? (static_cast<uint64_t>(n) + block - 1) / block : 0;
    const uint8_t* scales = r.take(blocks * 4, "block scales");
    const uint8_t* bits = r.take(wire::bytes_for_bits(n), "sign bits");
    r.finish();
    if (!block) return bitpack::add_signs(bits, n, scale, -scale, out);
    for (uint64_t b = 0; b < blocks; ++b) {
      float s;
      std::memcpy(&s, scales + 4 * b, 4);
      const int64_t begin = static_cast<int64_t>(b * block);
      const int64_t length = std::min<int64_t>(block, n - begin);
      // Blocks start on byte boundaries when block % 8 == 0; otherwise go element by element.
      if (begin % 8 == 0) {
        bitpack::add_signs(bits + begin / 8, length, scale * s, scale * -s, out + begin);
      } else {
        for (int64_t i = begin; i < begin + length; ++i) out[i] += ((bits[i / 8] >> (i % 8)) & 1) ? scale * s : scale * -s;
      }
    }
  }

  // With error feedback and byte-aligned blocks, one streaming pass: per block (in L1),
  // u = x + residual and its magnitude sum, then its bits and the residual update.
  // Otherwise the generic path. Both leave what decode_add(−1) of the payload leaves.
  void encode(const float* x, int64_t n, float* residual, const EncodeContext& ctx,
              std::vector<uint8_t>& out) const override {
    if (!residual || block_ == 0 || block_ % 8 != 0) return CodecBase::encode(x, n, residual, ctx, out);
    const int64_t blocks = (n + block_ - 1) / block_;
    wire::Writer w(out);
    w.header(id(), n);
    w.put<uint32_t>(static_cast<uint32_t>(block_));
    const size_t scales_at = out.size();
    w.reserve(blocks * 4);
    const size_t bits_at = out.size();
    w.reserve(wire::bytes_for_bits(n));
    uint8_t* scales = out.data() + scales_at;  // both after the last resize of `out`
    uint8_t* bits = out.data() + bits_at;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * block_, length = std::min(n - begin, block_);
      const float s = static_cast<float>(block_l1(x + begin, residual + begin, length) / static_cast<double>(length));
      std::memcpy(scales + 4 * b, &s, 4);
      bitpack::pack_nonnegative(residual + begin, length, bits + begin / 8);
      bitpack::add_signs(bits + begin / 8, length, -s, s, residual + begin);
    }
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const override {
    wire::Writer w(out);
    w.header(id(), n);
    w.put<uint32_t>(static_cast<uint32_t>(block_));
    const int64_t blocks = block_ ? (n + block_ - 1) / block_ : 0;
    uint8_t* scales = w.reserve(blocks * 4);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * block_, length = std::min(n - begin, block_);
      const float s = static_cast<float>(block_l1(u + begin, nullptr, length) / static_cast<double>(length));
      std::memcpy(scales + 4 * b, &s, 4);
    }
    bitpack::pack_nonnegative(u, n, w.reserve(wire::bytes_for_bits(n)));
  }

 private:
  // Σ|u_i| over one block, u = x (+ residual, written back): eight float lanes summed in
  // a fixed order, so the compiler vectorizes it and every machine gets the same bits.
  static double block_l1(const float* x, float* residual, int64_t length) {
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    if (residual) {
      for (; i + 8 <= length; i += 8) {
        for (int j = 0; j < 8; ++j) {
          residual[i + j] += x[i + j];
          lanes[j] += std::fabs(residual[i + j]);
        }
      }
      for (; i < length; ++i) lanes[0] += std::fabs(residual[i] += x[i]);
    } else {
      for (; i + 8 <= length; i += 8) {
        for (int j = 0; j < 8; ++j) lanes[j] += std::fabs(x[i + j]);
      }
      for (; i < length; ++i) lanes[0] += std::fabs(x[i]);
    }
    double total = 0.0;
    for (float lane : lanes) total += lane;
    return total;
  }

  int64_t block_;
};

}  // namespace

std::unique_ptr<Codec> make_sign_codec(int64_t block) { return std::make_unique<SignCodec>(block); }

}  // namespace gradzip
