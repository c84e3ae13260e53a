#include <cmath>

#include "codec/bitpack.h"
#include "codec/codec_base.h"
#include "codec/sign_codec.h"

namespace gradzip {

SignLayout sign_layout(int64_t n, int64_t block) {
  SignLayout layout;
  layout.block = static_cast<uint32_t>(block);
  layout.blocks = block ? (static_cast<uint64_t>(n) + layout.block - 1) / layout.block : 0;
  layout.scales = {kPayloadHeaderBytes + 4, layout.blocks * 4};
  layout.bits = {layout.scales.offset + layout.scales.bytes, wire::bytes_for_bits(static_cast<uint64_t>(n))};
  layout.bytes = layout.bits.offset + layout.bits.bytes;
  return layout;
}

void write_sign_fields(wire::Writer& w, int64_t n, int64_t block) {
  w.header(CodecId::kSign, static_cast<uint64_t>(n));
  w.put<uint32_t>(static_cast<uint32_t>(block));
}

SignLayout read_sign_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kSign, n);
  const SignLayout layout = sign_layout(n, r.get<uint32_t>("block"));
  r.take(layout.scales.bytes, "block scales");
  r.take(layout.bits.bytes, "sign bits");
  r.finish();
  return layout;
}

namespace {

class SignCodec final : public ElementwiseCodec, public WithParameters<SignParameters> {
 public:
  explicit SignCodec(const SignParameters& p) : ElementwiseCodec(CodecId::kSign), WithParameters(p) {}
  bool biased() const override { return !parameters_.majority; }
  bool carries_non_finite() const override { return !parameters_.majority; }
  bool votes() const override { return parameters_.majority; }
  bool per_parameter_by_default() const override { return true; }
  size_t max_payload_bytes(int64_t n) const override { return sign_layout(n, block()).bytes; }

  void decode_add_range(const uint8_t* data, size_t size, float* out, int64_t n, int64_t begin, int64_t end,
                        float scale) const override {
    wire::Reader r(data, size, "sign");
    const SignLayout layout = read_sign_layout(r, n);
    const uint8_t* scales = r.at(layout.scales);
    const uint8_t* bits = r.at(layout.bits);
    // Each part from a byte boundary goes by bytes; the others element by element.
    const auto add = [&](int64_t from, int64_t to, float plus, float minus) {
      if (from % 8 == 0) return bitpack::add_signs(bits + from / 8, to - from, plus, minus, out + from);
      for (int64_t i = from; i < to; ++i) out[i] += ((bits[i / 8] >> (i % 8)) & 1) ? plus : minus;
    };
    if (!layout.block) return add(begin, end, scale, -scale);
    const int64_t block = layout.block;
    for (int64_t b = begin / block; b * block < end; ++b) {
      float s;
      std::memcpy(&s, scales + 4 * b, 4);
      add(std::max(begin, b * block), std::min(end, (b + 1) * block), scale * s, scale * -s);
    }
  }

  // With error feedback and byte-aligned blocks, one streaming pass: per block (in L1),
  // u = x + residual and its magnitude sum, then its bits and the residual update.
  // Otherwise the generic path. Both leave what decode_add(−1) of the payload leaves.
  void encode(const float* x, int64_t n, float* residual, const EncodeContext& ctx,
              std::vector<uint8_t>& out) const override {
    if (!residual || block() == 0 || block() % 8 != 0) return ValueCodec::encode(x, n, residual, ctx, out);
    const SignLayout layout = sign_layout(n, block());
    const size_t start = out.size();
    wire::Writer w(out);
    write_sign_fields(w, n, block());
    w.reserve(layout.scales.bytes + layout.bits.bytes);
    uint8_t* scales = out.data() + start + layout.scales.offset;  // both after the last resize of `out`
    uint8_t* bits = out.data() + start + layout.bits.offset;
    for (int64_t b = 0; b < static_cast<int64_t>(layout.blocks); ++b) {
      const int64_t begin = b * block(), length = std::min(n - begin, block());
      const float s = static_cast<float>(block_l1(x + begin, residual + begin, length) / static_cast<double>(length));
      std::memcpy(scales + 4 * b, &s, 4);
      bitpack::pack_nonnegative(residual + begin, length, bits + begin / 8);
      bitpack::add_signs(bits + begin / 8, length, -s, s, residual + begin);
    }
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const override {
    const SignLayout layout = sign_layout(n, block());
    wire::Writer w(out);
    write_sign_fields(w, n, block());
    uint8_t* scales = w.reserve(layout.scales.bytes);
    for (int64_t b = 0; b < static_cast<int64_t>(layout.blocks); ++b) {
      const int64_t begin = b * block(), length = std::min(n - begin, block());
      const float s = static_cast<float>(block_l1(u + begin, nullptr, length) / static_cast<double>(length));
      std::memcpy(scales + 4 * b, &s, 4);
    }
    bitpack::pack_nonnegative(u, n, w.reserve(layout.bits.bytes));
  }

 private:
  int64_t block() const { return parameters_.block; }
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

};

}  // namespace

const SignParameters& sign_parameters(const Codec& codec) { return parameters_of<SignParameters>(codec); }

const CodecRecord& sign_record() {
  static const CodecRecord record = {
      CodecId::kSign,
      "sign",
      "one sign bit per element; block>0 adds a scale per block (EF-SignSGD), vote=majority sends plain signs",
      {SpecKey::integer("block", "512", 0, 1 << 30,
                        "elements per scale (EF-SignSGD); 0 sends plain signs; default 0 with vote=majority"),
       SpecKey::choice("vote", "mean", {"mean", "majority"},
                       "mean: the average of the scaled signs; majority: the sign of the summed votes (0 on a tie)"),
       SpecKey::number("momentum", "", 0.0, 0.999,
                       "all-reduces: compress each tensor's momentum u = m·u + x with error feedback instead of x "
                       "(1-bit SGD with momentum); use an optimizer without momentum (absent: off)")},
      [](const Spec& spec) -> std::unique_ptr<Codec> {
        SignParameters p;
        p.majority = spec.get_string("vote") == "majority";
        p.block = p.majority && !spec.has("block") ? 0 : spec.get_int("block");  // majority: plain signs
        if (p.majority && p.block != 0) {
          throw SpecError("gradzip: spec '" + spec.str() + "': vote=majority sends plain signs: block must be 0");
        }
        return std::make_unique<SignCodec>(p);
      },
      GRADZIP_DEVICE_HALF(kSignDevice),
  };
  return record;
}

}  // namespace gradzip
