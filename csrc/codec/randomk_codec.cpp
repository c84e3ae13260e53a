#include "codec/randomk_codec.h"

#include <algorithm>
#include <unordered_set>

#include "codec/codec_base.h"
#include "codec/element_math.cuh"
#include "codec/selection_codec.h"
#include "codec/wire.h"

namespace gradzip {

namespace {

std::vector<int64_t> sample_indices(int64_t n, int64_t k, uint64_t seed, uint64_t step) {
  std::vector<int64_t> chosen;
  chosen.reserve(k);
  std::unordered_set<int64_t> taken(static_cast<size_t>(k) * 2);
  for (int64_t j = n - k; j < n; ++j) {
    const auto r = math::philox4x32_10(static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32),
                                       static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
                                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    const uint64_t wide = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
    const int64_t t = static_cast<int64_t>(wide % static_cast<uint64_t>(j + 1));
    const int64_t pick = taken.insert(t).second ? t : j;
    if (pick == j) taken.insert(j);
    chosen.push_back(pick);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

}  // namespace

std::shared_ptr<const std::vector<int64_t>> randomk_indices(int64_t n, int64_t k, uint64_t seed, uint64_t step) {
  thread_local struct {
    int64_t n = -1, k = -1;
    uint64_t seed = 0, step = 0;
    std::shared_ptr<const std::vector<int64_t>> chosen;
  } last;
  if (last.chosen && last.n == n && last.k == k && last.seed == seed && last.step == step) return last.chosen;
  auto chosen = std::make_shared<const std::vector<int64_t>>(sample_indices(n, k, seed, step));
  last.chosen = k <= kKeptRandomKEntries ? chosen : nullptr;
  last.n = n;
  last.k = k;
  last.seed = seed;
  last.step = step;
  return chosen;
}

namespace {

RandomKLayout laid_out(uint64_t k, uint64_t seed, uint64_t step, float value_scale) {
  RandomKLayout layout{.k = k, .seed = seed, .step = step, .value_scale = value_scale, .values = {}, .bytes = 0};
  layout.values = {kPayloadHeaderBytes + 28, k * 4};
  layout.bytes = layout.values.offset + layout.values.bytes;
  return layout;
}

}  // namespace

RandomKLayout randomk_layout(int64_t n, const RandomKParameters& p, uint64_t seed, uint64_t step) {
  const int64_t k = count_for_density(p.density, n);
  return laid_out(static_cast<uint64_t>(k), seed, step,
                  p.unbiased && k > 0 ? static_cast<float>(static_cast<double>(n) / static_cast<double>(k)) : 1.0f);
}

void write_randomk_fields(wire::Writer& w, int64_t n, const RandomKLayout& layout) {
  w.header(CodecId::kRandomK, static_cast<uint64_t>(n));
  w.put<uint64_t>(layout.k);
  w.put<uint64_t>(layout.seed);
  w.put<uint64_t>(layout.step);
  w.put<float>(layout.value_scale);
}

RandomKLayout read_randomk_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kRandomK, n);
  const uint64_t k = r.get_count("k", n);
  const auto seed = r.get<uint64_t>("seed");
  const auto step = r.get<uint64_t>("step");
  const RandomKLayout layout = laid_out(k, seed, step, r.get<float>("value scale"));
  r.take(layout.values.bytes, "values");
  r.finish();
  return layout;
}

namespace {

class RandomKCodec final : public ValueCodec, public WithParameters<RandomKParameters> {
 public:
  explicit RandomKCodec(const RandomKParameters& p) : ValueCodec(CodecId::kRandomK), WithParameters(p) {}
  bool biased() const override { return !parameters_.unbiased; }
  Budget budget() const override { return {BudgetKind::kDensity, parameters_.density}; }
  std::unique_ptr<Codec> with_budget(double density) const override {
    RandomKParameters p = parameters_;
    p.density = checked_density(*this, density);
    return std::make_unique<RandomKCodec>(p);
  }
  bool carries_non_finite() const override { return false; }
  bool selects() const override { return true; }
  size_t max_payload_bytes(int64_t n) const override { return randomk_layout(n, parameters_, 0, 0).bytes; }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "randomk");
    const RandomKLayout layout = read_randomk_layout(r, n);
    const uint8_t* values = r.at(layout.values);
    const auto entries = randomk_indices(n, static_cast<int64_t>(layout.k), layout.seed, layout.step);
    const std::vector<int64_t>& chosen = *entries;
    for (uint64_t j = 0; j < layout.k; ++j) {
      float v;
      std::memcpy(&v, values + 4 * j, 4);
      out[chosen[j]] += scale * (layout.value_scale * v);
    }
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext& ctx, std::vector<uint8_t>& out) const override {
    const RandomKLayout layout = randomk_layout(n, parameters_, ctx.seed, ctx.step);
    const auto k = static_cast<int64_t>(layout.k);
    const auto entries = randomk_indices(n, k, ctx.seed, ctx.step);
    const std::vector<int64_t>& chosen = *entries;
    wire::Writer w(out);
    write_randomk_fields(w, n, layout);
    uint8_t* values = w.reserve(layout.values.bytes);
    for (int64_t j = 0; j < k; ++j) std::memcpy(values + 4 * j, u + chosen[j], 4);
    report_sent(ctx, chosen);
  }

};

}  // namespace

const RandomKParameters& randomk_parameters(const Codec& codec) { return parameters_of<RandomKParameters>(codec); }

const CodecRecord& randomk_record() {
  static const CodecRecord record = {
      CodecId::kRandomK,
      "randomk",
      "ceil(density·n) elements chosen by a seed shared by all ranks; unbiased=1 scales by n/k",
      {density_key(), density_warmup_key(), momentum_key(),
       SpecKey::boolean("unbiased", "1", "scale the values by n/k, so the estimate is unbiased")},
      [](const Spec& spec) -> std::unique_ptr<Codec> {
        return std::make_unique<RandomKCodec>(
            RandomKParameters{.density = spec.get_double("density"), .unbiased = spec.get_bool("unbiased")});
      },
      GRADZIP_DEVICE_HALF(kRandomKDevice),
  };
  return record;
}

}  // namespace gradzip
