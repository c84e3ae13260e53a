// The layer budget (aggregate/layer_budget.h): the dynamic programme against every
// choice enumerated, the budget never exceeded, the levels a codec offers, and the
// errors of the levels against a top-k reference.
#include "aggregate/layer_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "aggregate/slots.h"
#include "codec/codec_record.h"

namespace gradzip {
namespace {

std::shared_ptr<const Codec> codec(const std::string& spec) { return make_codec(parse_spec(spec)); }

int64_t bytes_of(const std::vector<std::vector<int64_t>>& bytes, const std::vector<int>& choice) {
  int64_t total = 0;
  for (size_t i = 0; i < choice.size(); ++i) total += bytes[i][static_cast<size_t>(choice[i])];
  return total;
}

double error_of(const std::vector<std::vector<double>>& error, const std::vector<int>& choice) {
  double total = 0;
  for (size_t i = 0; i < choice.size(); ++i) total += error[i][static_cast<size_t>(choice[i])];
  return total;
}

struct Tables {
  std::vector<std::vector<double>> error;
  std::vector<std::vector<int64_t>> bytes;
};

// Bytes rise and errors fall with the level, as a codec's do; both at random scales.
Tables random_tables(std::mt19937& gen, int layers, int levels) {
  Tables t{std::vector<std::vector<double>>(layers), std::vector<std::vector<int64_t>>(layers)};
  for (int i = 0; i < layers; ++i) {
    double e = std::ldexp(1.0, static_cast<int>(gen() % 20));
    int64_t b = 1 + static_cast<int64_t>(gen() % 50);
    for (int l = 0; l < levels; ++l) {
      t.bytes[i].push_back(b);
      t.error[i].push_back(e);
      b += 1 + static_cast<int64_t>(gen() % 60);
      e *= std::uniform_real_distribution<double>(0.1, 0.9)(gen);
    }
  }
  return t;
}

// The least error of every choice within `budget`, enumerated (`start` when none is less).
double least_error_enumerated(const Tables& t, int64_t budget, double start) {
  const int layers = static_cast<int>(t.error.size()), levels = static_cast<int>(t.error.front().size());
  double best = start;
  std::vector<int> choice(layers, 0);
  for (;;) {
    if (bytes_of(t.bytes, choice) <= budget) best = std::min(best, error_of(t.error, choice));
    int i = 0;
    while (i < layers && ++choice[i] == levels) choice[i++] = 0;
    if (i == layers) return best;
  }
}

TEST(LayerBudgetTest, ChoosesTheLeastErrorWithinTheBudgetAsEnumerationDoes) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int layers = 1 + static_cast<int>(gen() % 5);
    const int levels = 2 + static_cast<int>(gen() % 4);
    const int base = static_cast<int>(gen() % static_cast<unsigned>(levels));
    const Tables t = random_tables(gen, layers, levels);
    const int64_t budget = bytes_of(t.bytes, std::vector<int>(layers, base));
    const double best = least_error_enumerated(t, budget, error_of(t.error, std::vector<int>(layers, base)));
    const std::vector<int> got = choose_levels(t.error, t.bytes, base);
    ASSERT_EQ(got.size(), static_cast<size_t>(layers));
    EXPECT_LE(bytes_of(t.bytes, got), budget) << "trial " << trial;
    // The budget's bins are finer than any byte count here: the programme is exact.
    EXPECT_DOUBLE_EQ(error_of(t.error, got), best) << "trial " << trial;
  }
}

TEST(LayerBudgetTest, AnExplicitBudgetIsMetAsEnumerationMeetsIt) {
  // The spec's `budget`: the bytes are set apart from the base level, above or below it.
  std::mt19937 gen(13);
  for (int trial = 0; trial < 300; ++trial) {
    const int layers = 1 + static_cast<int>(gen() % 5);
    const int levels = 2 + static_cast<int>(gen() % 4);
    const int base = static_cast<int>(gen() % static_cast<unsigned>(levels));
    const Tables t = random_tables(gen, layers, levels);
    const int64_t least = bytes_of(t.bytes, std::vector<int>(layers, 0));
    const int64_t most = bytes_of(t.bytes, std::vector<int>(layers, levels - 1));
    const int64_t budget = least + static_cast<int64_t>(gen() % static_cast<uint64_t>(most - least + 1));
    const std::vector<int> got = choose_levels(t.error, t.bytes, base, budget);
    EXPECT_LE(bytes_of(t.bytes, got), budget) << "trial " << trial;
    EXPECT_DOUBLE_EQ(error_of(t.error, got), least_error_enumerated(t, budget, INFINITY)) << "trial " << trial;
  }
  // Below the fewest bytes the levels offer: the fewest, everywhere.
  const std::vector<std::vector<double>> error(3, {4.0, 2.0, 1.0});
  const std::vector<std::vector<int64_t>> bytes(3, {10, 20, 40});
  EXPECT_EQ(choose_levels(error, bytes, 1, 29), std::vector<int>(3, 0));
  EXPECT_EQ(choose_levels(error, bytes, 1, 0), std::vector<int>(3, 0));
  // Room for every layer's most: the most, everywhere.
  EXPECT_EQ(choose_levels(error, bytes, 1, 120), std::vector<int>(3, 2));
}

TEST(LayerBudgetTest, LargeBudgetsStayWithinTheBudgetAndKeepTheBaseWhenNothingIsBetter) {
  // Byte counts far above the bins: rounding up keeps every choice within the budget.
  std::mt19937 gen(11);
  std::vector<std::vector<double>> error(40);
  std::vector<std::vector<int64_t>> bytes(40);
  for (int i = 0; i < 40; ++i) {
    for (int l = 0; l < 7; ++l) {
      bytes[i].push_back((int64_t{1000} << l) + static_cast<int64_t>(gen() % 997));
      error[i].push_back(std::ldexp(1.0, static_cast<int>(gen() % 30)) / (l + 1));
    }
  }
  const std::vector<int> got = choose_levels(error, bytes, 3);
  EXPECT_LE(bytes_of(bytes, got), bytes_of(bytes, std::vector<int>(40, 3)));
  EXPECT_LE(error_of(error, got), error_of(error, std::vector<int>(40, 3)));
  // Equal layers whose errors halve as their bytes double: more for one layer costs
  // another more than it saves, so the base stays.
  const std::vector<std::vector<double>> flat(3, {4.0, 2.0, 1.0});
  const std::vector<std::vector<int64_t>> doubling(3, {10, 20, 40});
  EXPECT_EQ(choose_levels(flat, doubling, 1), std::vector<int>(3, 1));
}

TEST(LayerBudgetTest, ALayerThatLosesMoreGetsMore) {
  // Layer 0's gradient is spread (top-k at the base loses much), layer 1's is nearly one
  // spike: layer 1's bytes go to layer 0 (budget 80: levels 3 and 1).
  const std::vector<std::vector<double>> error = {{100, 80, 50, 20, 5}, {1, 0.5, 0.2, 0.1, 0}};
  const std::vector<std::vector<int64_t>> bytes = {{10, 20, 40, 60, 80}, {10, 20, 40, 80, 160}};
  const std::vector<int> got = choose_levels(error, bytes, 2);
  EXPECT_EQ(got, (std::vector<int>{3, 1}));
}

TEST(LayerBudgetTest, RefusesMalformedTables) {
  EXPECT_THROW(choose_levels({{1.0, NAN}}, {{1, 2}}, 0), c10::Error);
  EXPECT_THROW(choose_levels({{1.0, 2.0}}, {{1}}, 0), c10::Error);
  EXPECT_THROW(choose_levels({{1.0, 2.0}}, {{1, 2}}, 2), c10::Error);
  EXPECT_TRUE(choose_levels({}, {}, 0).empty());
}

TEST(LayerBudgetTest, ACodecsLevelsSurroundItsOwn) {
  const CodecLevels topk = codec_levels(codec("topk:density=0.01"));
  ASSERT_EQ(topk.codecs.size(), 13u);
  EXPECT_EQ(topk.base, 6);
  for (int l = 0; l < 13; ++l) {
    EXPECT_DOUBLE_EQ(topk.codecs[l]->budget().value, 0.01 * std::exp2((l - 6) / 2.0));
    if (l > 0) EXPECT_GT(slot_bytes(*topk.codecs[l], 100000), slot_bytes(*topk.codecs[l - 1], 100000));
  }
  // Densities above 1 are left out (0.5: 1/16 .. 1).
  EXPECT_EQ(codec_levels(codec("stc:density=0.5")).codecs.size(), 9u);
  // QSGD: levels + 1 halved or doubled, 1 level at the least (bits=4: 7 levels).
  const CodecLevels qsgd = codec_levels(codec("qsgd:bits=4"));
  std::vector<int> counts;
  for (const auto& c : qsgd.codecs) counts.push_back(static_cast<int>(c->budget().value));
  EXPECT_EQ(counts, (std::vector<int>{1, 3, 7, 15, 31, 63}));
  EXPECT_EQ(qsgd.base, 2);
  EXPECT_FALSE(has_levels(*codec("sign")));
  EXPECT_THROW(codec_levels(codec("fp16")), c10::Error);
}

TEST(LayerBudgetTest, LevelErrorsAreTheSquaredDistanceToTheDecodedPayload) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  const int64_t n = 5000;
  at::Tensor x = at::empty({n}, at::kFloat);
  for (int64_t i = 0; i < n; ++i) x[i] = normal(gen);
  const CodecLevels levels = codec_levels(codec("topk:density=0.02"));
  const std::vector<double> errors = level_errors(levels, x, EncodeContext{});
  ASSERT_EQ(errors.size(), levels.codecs.size());
  const at::Tensor sorted = std::get<0>(x.to(at::kDouble).pow(2).sort(0, /*descending=*/true));
  for (size_t l = 0; l < errors.size(); ++l) {
    // Top-k at density d leaves the n − k smallest squares.
    const auto k = static_cast<int64_t>(std::ceil(levels.codecs[l]->budget().value * static_cast<double>(n)));
    const double expected = sorted.narrow(0, k, n - k).sum().item<double>();
    EXPECT_NEAR(errors[l], expected, 1e-9 * expected) << "level " << l;
    if (l > 0) EXPECT_LT(errors[l], errors[l - 1]);
  }
}

// ‖x − decode(encode(x))‖² of every level, encoded and decoded: what the shortcut of
// Codec::errors_at_budgets must equal.
std::vector<double> encoded_and_decoded_errors(const CodecLevels& levels, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<double> errors;
  for (const auto& level : levels.codecs) {
    std::vector<uint8_t> payload;
    level->encode(x.data(), n, nullptr, EncodeContext{}, payload);
    std::vector<float> decoded(x.size(), 0.0f);
    level->decode_add(payload.data(), payload.size(), decoded.data(), n);
    double e = 0;
    for (size_t i = 0; i < x.size(); ++i) e += std::pow(static_cast<double>(x[i]) - decoded[i], 2);
    errors.push_back(e);
  }
  return errors;
}

TEST(LayerBudgetTest, TopKAndStcErrorsFromTheMagnitudesEqualTheEncodedAndDecoded) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> few(-3, 3);
  for (const std::string spec : {"topk:density=0.02", "stc:density=0.02", "stc:density=0.3", "topk:density=0.5"}) {
    for (const bool ties : {false, true}) {
      // With ties many magnitudes equal the threshold: whichever are chosen, the error is the same.
      std::vector<float> x(7001);
      for (auto& v : x) v = ties ? static_cast<float>(few(gen)) : normal(gen) * (1.0f + static_cast<float>(few(gen) == 3) * 50.0f);
      const CodecLevels levels = codec_levels(codec(spec));
      std::vector<double> budgets;
      for (const auto& level : levels.codecs) budgets.push_back(level->budget().value);
      const std::vector<double> shortcut =
          levels.codecs.front()->errors_at_budgets(x.data(), static_cast<int64_t>(x.size()), budgets);
      const std::vector<double> expected = encoded_and_decoded_errors(levels, x);
      ASSERT_EQ(shortcut.size(), expected.size()) << spec;
      double total = 0;
      for (float v : x) total += static_cast<double>(v) * v;
      for (size_t l = 0; l < expected.size(); ++l) {
        EXPECT_NEAR(shortcut[l], expected[l], 1e-12 * total) << spec << " ties " << ties << " level " << l;
      }
      at::Tensor tensor = at::from_blob(x.data(), {static_cast<int64_t>(x.size())}, at::kFloat);
      EXPECT_EQ(level_errors(levels, tensor, EncodeContext{}), shortcut) << spec;
    }
  }
}

TEST(LayerBudgetTest, CodecsWithoutTheShortcutAreEncodedAndDecoded) {
  std::mt19937 gen(6);
  std::normal_distribution<float> normal;
  std::vector<float> x(3000);
  for (auto& v : x) v = normal(gen);
  const auto n = static_cast<int64_t>(x.size());
  for (const std::string spec : {"topk:density=0.02,values=fp16", "stc:density=0.02,approx=1", "randomk:density=0.02",
                                 "qsgd:bits=4"}) {
    const CodecLevels levels = codec_levels(codec(spec));
    std::vector<double> budgets;
    for (const auto& level : levels.codecs) budgets.push_back(level->budget().value);
    EXPECT_TRUE(levels.codecs.front()->errors_at_budgets(x.data(), n, budgets).empty()) << spec;
    at::Tensor tensor = at::from_blob(x.data(), {n}, at::kFloat);
    if (spec.starts_with("topk") || spec.starts_with("stc")) {  // deterministic encodes
      EXPECT_EQ(level_errors(levels, tensor, EncodeContext{}), encoded_and_decoded_errors(levels, x)) << spec;
    }
  }
  // A non-finite x has no magnitudes to sort: the encode-decode path.
  std::vector<float> bad = x;
  bad[17] = std::numeric_limits<float>::infinity();
  const CodecLevels stc = codec_levels(codec("stc:density=0.02"));
  EXPECT_TRUE(stc.codecs.front()->errors_at_budgets(bad.data(), n, {0.01, 0.02}).empty());
}

}  // namespace
}  // namespace gradzip
