#include "codec/topk_select.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

#include "codec/element_math.cuh"

namespace gradzip {
namespace {

// The reference: nth_element on (magnitude key descending, index ascending).
std::vector<int64_t> reference_topk(const std::vector<float>& x, int64_t k) {
  std::vector<int64_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int64_t a, int64_t b) {
    const uint32_t ka = math::magnitude_key(x[a]), kb = math::magnitude_key(x[b]);
    return ka != kb ? ka > kb : a < b;
  };
  k = std::clamp<int64_t>(k, 0, static_cast<int64_t>(x.size()));
  std::nth_element(order.begin(), order.begin() + k, order.end(), before);
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<float> random_input(int64_t n, int seed, bool ties) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = ties ? std::round(normal(rng) * 2.0f) / 2.0f : normal(rng);
  return x;
}

TEST(TopKSelectTest, MatchesNthElementIncludingTies) {
  std::vector<int64_t> got;
  for (int64_t n : {1, 2, 7, 100, 1000, 4097, 100000}) {
    for (bool ties : {false, true}) {
      const auto x = random_input(n, static_cast<int>(n) + ties, ties);
      for (int64_t k : {int64_t{0}, int64_t{1}, n / 100, n / 10, n / 2, n - 1, n, n + 5}) {
        select_topk(x.data(), nullptr, n, k, got);
        ASSERT_EQ(got, reference_topk(x, k)) << "n=" << n << " k=" << k << " ties=" << ties;
      }
    }
  }
}

TEST(TopKSelectTest, AllEqualMagnitudesTakeTheLowestIndices) {
  std::vector<float> x = {1, -1, 1, -1, 1, -1};
  std::vector<int64_t> got;
  select_topk(x.data(), nullptr, 6, 4, got);
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(TopKSelectTest, NanAndInfAreTheLargest) {
  std::vector<float> x = {1, std::nanf(""), -std::numeric_limits<float>::infinity(), 5, 0};
  std::vector<int64_t> got;
  select_topk(x.data(), nullptr, 5, 2, got);
  EXPECT_EQ(got, (std::vector<int64_t>{1, 2}));
}

TEST(TopKSelectTest, ApproximateCountIsNearK) {
  const int64_t n = 2000000, k = n / 100;
  const auto x = random_input(n, 11, false);
  std::vector<int64_t> got;
  select_topk_approx(x.data(), nullptr, n, k, got);
  EXPECT_NEAR(static_cast<double>(got.size()), static_cast<double>(k), 0.1 * k);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  // Everything chosen is at least as large as everything left out.
  std::vector<bool> chosen(n);
  for (auto i : got) chosen[i] = true;
  float smallest_in = INFINITY, largest_out = 0;
  for (int64_t i = 0; i < n; ++i) {
    (chosen[i] ? smallest_in : largest_out) =
        chosen[i] ? std::min(smallest_in, std::fabs(x[i])) : std::max(largest_out, std::fabs(x[i]));
  }
  EXPECT_GE(smallest_in, largest_out);
}

// A caller's own pass (aggregate/residual_selection.h): the candidates at or above the
// sampled threshold decide exactly select_topk's indices, or decline.
TEST(TopKSelectTest, CandidatesOfTheSampledThresholdGiveTheExactSelection) {
  const int64_t n = 200000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int decided = 0;
  for (int pattern = 0; pattern < 3; ++pattern) {
    std::vector<float> x(n), residual(n), u(n);
    for (int64_t i = 0; i < n; ++i) {
      const float scale = pattern == 0 ? 1.0f : pattern == 1 ? (i < n / 2 ? 1e-3f : 10.0f) : std::round(normal(rng));
      x[i] = normal(rng) * scale;
      residual[i] = normal(rng) * 0.1f;
      u[i] = residual[i] + x[i];
    }
    for (int64_t k : {int64_t{1}, n / 1000, n / 100, n / 10}) {
      const std::optional<uint32_t> lowest = sampled_threshold(x.data(), residual.data(), n, k);
      ASSERT_TRUE(lowest) << "pattern " << pattern << " k " << k;
      std::vector<std::pair<uint32_t, int64_t>> candidates;
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t key = math::magnitude_key(u[i]);
        if (key >= *lowest && static_cast<int64_t>(candidates.size()) <= candidate_cap(k)) candidates.emplace_back(key, i);
      }
      std::vector<int64_t> got;
      const bool decides = select_from_candidates(candidates, k, got);
      const auto count = static_cast<int64_t>(candidates.size());
      ASSERT_EQ(decides, count >= k && count <= candidate_cap(k)) << "pattern " << pattern << " k " << k;
      if (decides) {
        ASSERT_EQ(got, reference_topk(u, k)) << "pattern " << pattern << " k " << k;
        ++decided;
      }
    }
  }
  EXPECT_GE(decided, 9);  // the estimate holds for most inputs
  EXPECT_FALSE(sampled_threshold(nullptr, nullptr, 1000, 10));  // too small to sample
  std::vector<std::pair<uint32_t, int64_t>> few = {{7, 3}};
  std::vector<int64_t> got;
  EXPECT_FALSE(select_from_candidates(few, 2, got));  // fewer than k: the estimate was too high
}

}  // namespace
}  // namespace gradzip

namespace gradzip {
namespace {

// Magnitudes that differ by layer (as in a DDP bucket) make the 1% sample misjudge the
// threshold either way; the fallback must still give the exact answer, with and
// without a residual.
TEST(TopKSelectTest, SkewedInputsAndResidualsStayExact) {
  const int64_t n = 400000;
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int pattern = 0; pattern < 4; ++pattern) {
    std::vector<float> x(n), residual(n);
    for (int64_t i = 0; i < n; ++i) {
      const float scale = pattern == 0 ? 1.0f
                          : pattern == 1 ? (i < n / 2 ? 1e-3f : 10.0f)            // sample sees both halves
                          : pattern == 2 ? (i % 25000 < 1000 ? 100.0f : 0.01f)    // spikes between sample blocks
                                         : std::round(normal(rng)) * 0.5f;        // many ties
      x[i] = normal(rng) * scale;
      residual[i] = normal(rng) * 0.1f * scale;
    }
    std::vector<float> u(n);
    for (int64_t i = 0; i < n; ++i) u[i] = residual[i] + x[i];
    for (int64_t k : {int64_t{1}, n / 1000, n / 100, n / 10, n / 2}) {
      std::vector<int64_t> got;
      std::vector<float> r = residual;
      select_topk(x.data(), r.data(), n, k, got);
      ASSERT_EQ(got, reference_topk(u, k)) << "pattern " << pattern << " k " << k;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(math::float_bits(r[i]), math::float_bits(u[i]));
      select_topk(u.data(), nullptr, n, k, got);
      ASSERT_EQ(got, reference_topk(u, k)) << "pattern " << pattern << " k " << k;
    }
  }
}

}  // namespace
}  // namespace gradzip
