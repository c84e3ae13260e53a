#include <algorithm>
#include <cmath>

#include "codec/element_math.cuh"
#include "codec/selection_codec.h"
#include "codec/stc_codec.h"

namespace gradzip {

StcLayout stc_layout(uint64_t k, float mu, const PositionCoding& positions) {
  StcLayout layout;
  layout.k = k;
  layout.mu = mu;
  layout.mean = {kPayloadHeaderBytes + 8, 4};
  layout.positions = position_layout(layout.mean.offset + layout.mean.bytes, positions);
  layout.signs = {layout.positions.bytes.offset + layout.positions.bytes.bytes, wire::bytes_for_bits(k)};
  layout.bytes = layout.signs.offset + layout.signs.bytes;
  return layout;
}

void write_stc_fields(wire::Writer& w, int64_t n, const StcLayout& layout) {
  w.header(CodecId::kStc, static_cast<uint64_t>(n));
  w.put<uint64_t>(layout.k);
  w.put<float>(layout.mu);
  write_position_header(w, layout.positions.coding());
}

StcLayout read_stc_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kStc, n);
  const uint64_t k = r.get_count("k", n);
  const auto mu = r.get<float>("mu");
  const StcLayout layout = stc_layout(k, mu, read_position_layout(r, n, k).coding());
  r.take(layout.signs.bytes, "sign bits");
  r.finish();
  return layout;
}

namespace {

constexpr int64_t kGatherChunk = 1024;

class StcCodec final : public SelectionCodec<StcCodec, StcParameters> {
 public:
  explicit StcCodec(const StcParameters& parameters) : SelectionCodec(CodecId::kStc, parameters) {}
  size_t max_payload_bytes(int64_t n) const override {
    const int64_t max_k = max_selected(selection(), n);
    return kPayloadHeaderBytes + 12 + kPositionHeaderBytes + max_position_bytes(n, max_k) +
           wire::bytes_for_bits(max_k);
  }

  void decode_entries(const uint8_t* data, size_t size, int64_t n, float scale, Entries& entries) const override {
    wire::Reader r(data, size, "stc");
    const StcLayout layout = read_stc_layout(r, n);
    const uint64_t k = layout.k;
    const uint8_t* signs = r.at(layout.signs);
    entries.positions.resize(k);
    entries.values.resize(k);
    read_positions(r, layout.positions, k, n, entries.positions.data());
    // Each sign bit picks its value (a branch on random signs would mispredict half the time).
    const float by_bit[2] = {scale * -layout.mu, scale * layout.mu};
    for (uint64_t j = 0; j < k; ++j) entries.values[j] = by_bit[(signs[j / 8] >> (j % 8)) & 1];
  }

 protected:
  // Each chosen magnitude m is sent as the mean μ: Σ (m − μ)² = Σm² − 2μ·Σm + k·μ².
  double chosen_error(int64_t k, const MagnitudeSums& sums) const override {
    if (k == 0) return 0.0;
    const double mu = static_cast<float>(sums.chosen / static_cast<double>(k));
    return std::max(0.0, sums.chosen_squares - 2.0 * mu * sums.chosen + static_cast<double>(k) * mu * mu);
  }

  void write(const float* u, int64_t n, const std::vector<int64_t>& chosen,
             std::vector<uint8_t>& out) const override {
    const int64_t k = static_cast<int64_t>(chosen.size());
    // One gather of the chosen values, a chunk at a time (the loads of a chunk in flight
    // together), for both their mean and their signs.
    std::vector<double> lanes(math::kStcMeanLanes, 0.0);  // the order the GPU encoder follows too
    std::vector<uint8_t> sign_bits(wire::bytes_for_bits(static_cast<uint64_t>(k)), 0);
    float values[kGatherChunk];
    for (int64_t start = 0; start < k; start += kGatherChunk) {
      const int64_t count = std::min(kGatherChunk, k - start);
      for (int64_t j = 0; j < count; ++j) values[j] = u[chosen[start + j]];
      for (int64_t j = 0; j < count; ++j) {
        const int64_t at = start + j;
        lanes[at % math::kStcMeanLanes] += std::fabs(static_cast<double>(values[j]));
        sign_bits[at / 8] |= static_cast<uint8_t>(math::nonnegative_bit(values[j]) << (at % 8));
      }
    }
    double magnitude_sum = 0.0;
    for (double lane : lanes) magnitude_sum += lane;
    const float mu = k ? static_cast<float>(magnitude_sum / static_cast<double>(k)) : 0.0f;

    const CodedPositions positions = code_positions(chosen, n);
    const StcLayout layout = stc_layout(static_cast<uint64_t>(k), mu, positions.coding);
    wire::Writer w(out);
    write_stc_fields(w, n, layout);
    w.put_bytes(positions.bytes);
    w.put_bytes(sign_bits);
  }
};

StcParameters parse_stc(const Spec& spec) { return {parse_selection(spec)}; }

}  // namespace

const StcParameters& stc_parameters(const Codec& codec) { return parameters_of<StcParameters>(codec); }

const CodecRecord& stc_record() {
  static const CodecRecord record =
      selection_record<CodecId::kStc, StcCodec, parse_stc>(
      "stc", "sparse ternary: top density·n positions (Golomb-coded) with one sign bit each and one mean",
      GRADZIP_DEVICE_HALF(kStcDevice));
  return record;
}

}  // namespace gradzip
