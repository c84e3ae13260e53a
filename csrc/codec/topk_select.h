// Selection of the k entries of largest magnitude, without sorting.
//
// select_topk: exact. First one pass with a threshold estimated from a 1% sample that
// keeps every top-k entry and few others; when the estimate misses, an 11-bit histogram
// pass over the magnitude bits (the sign-cleared float bits order like |x|),
// nth_element on the boundary bucket's candidates only, then a filter pass. Ties at the threshold go to the lower indices, so every rank and
// every run agree. NaN counts as larger than +Inf.
// select_topk_approx: the threshold comes from a contiguous sample of about 1% of the
// elements; it returns every entry at or above it (about k of them, at least one when k > 0).
// Both return the chosen indices in ascending order.
// top_magnitude_sums: what top-k at several k keeps and leaves (the errors of a layer's
// densities, aggregate/layer_budget.h), without selecting each.
//
// With a non-null `residual`, both select from u = x + residual and leave u in
// `residual` (error feedback's first step, fused into the histogram pass).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "codec/element_math.cuh"

namespace gradzip {

void select_topk(const float* x, float* residual, int64_t n, int64_t k, std::vector<int64_t>& indices);
void select_topk_approx(const float* x, float* residual, int64_t n, int64_t k, std::vector<int64_t>& indices);

// select_topk's first try, for a caller that makes its pass itself (fused with work of
// its own): sampled_threshold, a key (magnitude bits) from a sample of about 1% of u =
// x (+ residual) that should keep every one of u's k largest and not many more (none
// when n is too small to sample, or k is 0 or n: select_topk then); the caller's pass
// collects the (key, index) of every element whose key is at or above it, in index
// order, stopping past candidate_cap(k); select_from_candidates then gives the indices
// select_topk gives, or false when the candidates do not decide (fewer than k: the
// estimate was too high; past the cap: too low).
// sampled_threshold_of takes u's keys from key_at(i) (a caller whose u is made otherwise).
template <class KeyAt>
std::optional<uint32_t> sampled_threshold_of(int64_t n, int64_t k, KeyAt&& key_at) {
  constexpr int kBlocks = 16;
  const int64_t per_block = std::max<int64_t>(256, n / 100 / kBlocks);
  if (k <= 0 || k >= n || per_block * kBlocks * 8 > n) return std::nullopt;  // too small to gain from sampling
  std::vector<uint32_t> sample;
  sample.reserve(per_block * kBlocks);
  for (int b = 0; b < kBlocks; ++b) {
    const int64_t start = (n - per_block) * b / (kBlocks - 1);
    for (int64_t i = start; i < start + per_block; ++i) sample.push_back(key_at(i));
  }
  const double expected = static_cast<double>(k) * static_cast<double>(sample.size()) / static_cast<double>(n);
  const int64_t rank = static_cast<int64_t>(expected * 1.5 + 4.0 * std::sqrt(expected) + 8.0);
  if (rank >= static_cast<int64_t>(sample.size())) return std::nullopt;
  std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(), std::greater<>());
  return sample[rank - 1];
}
inline std::optional<uint32_t> sampled_threshold(const float* x, const float* residual, int64_t n, int64_t k) {
  return sampled_threshold_of(n, k, [&](int64_t i) {
    return math::magnitude_key(residual ? residual[i] + x[i] : x[i]);  // = u_i, as the pass makes it
  });
}
int64_t candidate_cap(int64_t k);
bool select_from_candidates(const std::vector<std::pair<uint32_t, int64_t>>& candidates, int64_t k,
                            std::vector<int64_t>& indices);

// The sums, in float64, of the k largest magnitudes of x (`chosen`), of their squares
// (`chosen_squares`) and of the other elements' squares (`rest_squares`).
struct MagnitudeSums {
  double chosen = 0.0;
  double chosen_squares = 0.0;
  double rest_squares = 0.0;
};
// MagnitudeSums for each k of `ks` (each in [0, n]), from one copy of the magnitudes
// partitioned at every k (nth_element, largest k first): O(n + Σk), not a sort. x must
// be all finite. The same x gives the same bits on every rank.
std::vector<MagnitudeSums> top_magnitude_sums(const float* x, int64_t n, const std::vector<int64_t>& ks);

}  // namespace gradzip
