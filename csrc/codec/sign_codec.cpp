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

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const override {
    wire::Writer w(out);
    w.header(id(), n);
    w.put<uint32_t>(static_cast<uint32_t>(block_));
    if (block_) {
      const int64_t blocks = (n + block_ - 1) / block_;
      uint8_t* scales = w.reserve(blocks * 4);
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t begin = b * block_, end = std::min(n, begin + block_);
        double l1 = 0.0;
        for (int64_t i = begin; i < end; ++i) l1 += std::fabs(static_cast<double>(u[i]));
        const float s = static_cast<float>(l1 / static_cast<double>(end - begin));
        std::memcpy(scales + 4 * b, &s, 4);
      }
    }
    bitpack::pack_nonnegative(u, n, w.reserve(wire::bytes_for_bits(n)));
  }

 private:
  int64_t block_;
};

}  // namespace

std::unique_ptr<Codec> make_sign_codec(int64_t block) { return std::make_unique<SignCodec>(block); }

}  // namespace gradzip
