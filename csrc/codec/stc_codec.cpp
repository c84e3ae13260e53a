// stc, sparse ternary compression (Sattler et al., 2019): the k = ceil(density·n)
// entries of largest |u| become μ·sign(u_i), μ the mean of their magnitudes.
// Body: u64 k, f32 μ, u8 position coding (0 Golomb-Rice gaps, 1 bitmap), u8 Golomb
// parameter b, u64 position bytes, the positions, then ceil(k/8) bytes of sign bits
// (1 = positive) in position order. Golomb-Rice codes each gap g (zeros between two
// positions) as g >> b one-bits, a zero-bit, then the low b bits of g; the bitmap is
// used when it is smaller (dense selections).
#include <cmath>

#include "codec/bitpack.h"
#include "codec/selection_codec.h"
#include "codec/wire.h"
#include "element_math.cuh"

namespace gradzip {
namespace {

constexpr uint8_t kGolomb = 0, kBitmap = 1;

}  // namespace

// b* = 1 + floor(log2(ln(φ − 1) / ln(1 − p))) for the density p = k/n.
int stc_golomb_parameter(int64_t k, int64_t n) {
  const double p = static_cast<double>(k) / static_cast<double>(n);
  if (p >= 1.0 || k == 0) return 0;
  const double phi = (1.0 + std::sqrt(5.0)) / 2.0;
  const double b = 1.0 + std::floor(std::log2(std::log(phi - 1.0) / std::log1p(-p)));
  return b < 0 ? 0 : b > kMaxGolombParameter ? kMaxGolombParameter : static_cast<int>(b);
}

namespace {

class StcCodec final : public SelectionCodec {
 public:
  using SelectionCodec::SelectionCodec;
  CodecId id() const override { return CodecId::kStc; }
  std::string name() const override { return "stc"; }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "stc");
    r.header(id(), n);
    const uint64_t k = r.get_count("k", n);
    const float mu = r.get<float>("mu");
    const uint8_t coding = r.get<uint8_t>("position coding");
    const int b = r.get<uint8_t>("golomb parameter");
    const uint64_t position_bytes = r.get<uint64_t>("position bytes");
    if (coding != kGolomb && coding != kBitmap) r.fail("unknown position coding " + std::to_string(coding));
    if (b > kMaxGolombParameter) r.fail("golomb parameter " + std::to_string(b) + " above " + std::to_string(kMaxGolombParameter));
    const uint8_t* positions = r.take(position_bytes, "positions");
    const uint8_t* signs = r.take(wire::bytes_for_bits(k), "sign bits");
    r.finish();

    std::vector<int64_t> indices;
    indices.reserve(k);
    if (coding == kBitmap) {
      if (position_bytes != wire::bytes_for_bits(n)) r.fail("the bitmap is not ceil(n/8) bytes");
      for (int64_t i = 0; i < n; ++i) {
        if ((positions[i / 8] >> (i % 8)) & 1) indices.push_back(i);
      }
      if (indices.size() != k) r.fail("the bitmap marks " + std::to_string(indices.size()) + " positions, k is " + std::to_string(k));
    } else {
      bitpack::BitReader bits(positions, position_bytes);
      int64_t at = -1;
      for (uint64_t j = 0; j < k; ++j) {
        uint64_t quotient = 0;
        while (bits.get_bit()) {
          if (++quotient > static_cast<uint64_t>(n)) r.fail("a position gap runs past the tensor");
        }
        const uint64_t gap = (quotient << b) | bits.get(b);
        if (bits.failed()) r.fail("the positions end before k = " + std::to_string(k) + " were read");
        if (gap >= static_cast<uint64_t>(n - at - 1)) r.fail("position past the last element");
        at += static_cast<int64_t>(gap) + 1;
        indices.push_back(at);
      }
      if (wire::bytes_for_bits(bits.bits_read()) != position_bytes) r.fail("position bytes left over");
    }
    const float plus = scale * mu, minus = scale * -mu;
    for (uint64_t j = 0; j < k; ++j) out[indices[j]] += ((signs[j / 8] >> (j % 8)) & 1) ? plus : minus;
  }

 protected:
  void write(const float* u, int64_t n, const std::vector<int64_t>& chosen,
             std::vector<uint8_t>& out) const override {
    const int64_t k = static_cast<int64_t>(chosen.size());
    std::vector<double> lanes(math::kStcMeanLanes, 0.0);  // the order the GPU encoder follows too
    for (int64_t j = 0; j < k; ++j) lanes[j % math::kStcMeanLanes] += std::fabs(static_cast<double>(u[chosen[j]]));
    double magnitude_sum = 0.0;
    for (double lane : lanes) magnitude_sum += lane;
    const float mu = k ? static_cast<float>(magnitude_sum / static_cast<double>(k)) : 0.0f;

    const int b = stc_golomb_parameter(k, n);
    std::vector<uint8_t> golomb;
    bitpack::BitWriter bits(golomb);
    int64_t previous = -1;
    for (int64_t i : chosen) {
      const uint64_t gap = static_cast<uint64_t>(i - previous - 1);
      bits.put_ones(gap >> b);
      bits.put(0, 1);
      if (b) bits.put(gap & ((uint64_t{1} << b) - 1), b);
      previous = i;
    }
    bits.flush();
    const bool bitmap = golomb.size() > wire::bytes_for_bits(n);

    wire::Writer w(out);
    w.header(id(), n);
    w.put<uint64_t>(k);
    w.put<float>(mu);
    w.put<uint8_t>(bitmap ? kBitmap : kGolomb);
    w.put<uint8_t>(static_cast<uint8_t>(b));
    if (bitmap) {
      w.put<uint64_t>(wire::bytes_for_bits(n));
      uint8_t* map = w.reserve(wire::bytes_for_bits(n));
      for (int64_t i : chosen) map[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    } else {
      w.put<uint64_t>(golomb.size());
      std::memcpy(w.reserve(golomb.size()), golomb.data(), golomb.size());
    }
    uint8_t* signs = w.reserve(wire::bytes_for_bits(k));
    for (int64_t j = 0; j < k; ++j) signs[j / 8] |= static_cast<uint8_t>(math::nonnegative_bit(u[chosen[j]]) << (j % 8));
  }
};

}  // namespace

std::unique_ptr<Codec> make_stc_codec(double density, bool approx) { return std::make_unique<StcCodec>(density, approx); }

}  // namespace gradzip
