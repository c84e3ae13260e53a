#include "codec/topk_select.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <optional>

#include "codec/element_math.cuh"

namespace gradzip {
namespace {

constexpr int kDigitShift = 20;  // keys are < 2^31: bits 30..20 are the 11-bit digit
constexpr int kBuckets = 1 << 11;

// The histogram of the top digit of every key. With a residual, first makes
// residual = x + residual and histograms that.
std::array<int64_t, kBuckets> digit_histogram(const float* x, float* residual, int64_t n) {
  // Four 32-bit histograms (32 KB, in L1), merged afterwards, so neighbouring equal
  // digits do not wait on each other's increments.
  std::vector<std::array<uint32_t, kBuckets>> hist(4);
  for (auto& h : hist) h.fill(0);
  std::array<int64_t, kBuckets> total{};
  constexpr int64_t kChunk = int64_t{1} << 30;  // flush before a 32-bit counter could overflow
  for (int64_t from = 0; from < n; from += kChunk) {
    const int64_t to = std::min(n, from + kChunk);
    int64_t i = from;
    if (residual) {
      for (; i + 4 <= to; i += 4) {
        for (int j = 0; j < 4; ++j) {
          residual[i + j] += x[i + j];
          ++hist[j][math::magnitude_key(residual[i + j]) >> kDigitShift];
        }
      }
      for (; i < to; ++i) {
        residual[i] += x[i];
        ++hist[0][math::magnitude_key(residual[i]) >> kDigitShift];
      }
    } else {
      for (; i + 4 <= to; i += 4) {
        for (int j = 0; j < 4; ++j) ++hist[j][math::magnitude_key(x[i + j]) >> kDigitShift];
      }
      for (; i < to; ++i) ++hist[0][math::magnitude_key(x[i]) >> kDigitShift];
    }
    for (int b = 0; b < kBuckets; ++b) {
      total[b] += int64_t{hist[0][b]} + hist[1][b] + hist[2][b] + hist[3][b];
      hist[0][b] = hist[1][b] = hist[2][b] = hist[3][b] = 0;
    }
  }
  return total;
}

// The need-th largest key of `candidates` (1 <= need <= their count) and how many of the
// `need` largest equal it (the ties taken, the first in index order). Many candidates go
// through a histogram of the keys' span first, so that nth_element sorts only the
// boundary bucket's keys: the candidates of a sampled threshold crowd near the k-th, and
// one nth_element over all of them took about 8% of an STC all-reduce's time on the host.
struct Boundary {
  uint32_t threshold;
  int64_t ties;
};
Boundary boundary_of(const std::vector<std::pair<uint32_t, int64_t>>& candidates, int64_t need) {
  std::vector<uint32_t> keys;
  int64_t above = 0;  // candidates whose key is above the bucket `keys` holds
  constexpr size_t kSortAll = 8192;
  if (candidates.size() <= kSortAll) {
    keys.reserve(candidates.size());
    for (const auto& candidate : candidates) keys.push_back(candidate.first);
  } else {
    uint32_t lo = UINT32_MAX, hi = 0;
    for (const auto& candidate : candidates) {
      lo = std::min(lo, candidate.first);
      hi = std::max(hi, candidate.first);
    }
    constexpr int kDigitBits = 11;
    const uint32_t span = hi - lo;
    const int shift = std::max(0, static_cast<int>(std::bit_width(span)) - kDigitBits);
    std::vector<int64_t> count((span >> shift) + 1, 0);
    for (const auto& candidate : candidates) ++count[(candidate.first - lo) >> shift];
    size_t bucket = count.size() - 1;
    while (above + count[bucket] < need) above += count[bucket--];
    keys.reserve(count[bucket]);
    for (const auto& candidate : candidates) {
      if (((candidate.first - lo) >> shift) == bucket) keys.push_back(candidate.first);
    }
  }
  const int64_t in_bucket = need - above;  // 1 <= in_bucket <= keys.size()
  std::nth_element(keys.begin(), keys.begin() + (in_bucket - 1), keys.end(), std::greater<>());
  const uint32_t threshold = keys[in_bucket - 1];
  return {threshold, in_bucket - std::count_if(keys.begin(), keys.end(),
                                               [threshold](uint32_t key) { return key > threshold; })};
}

// The k largest of u (0 < k < n) given u's digit histogram, in one more pass: indices
// whose digit is above the boundary bucket are in for sure; the boundary bucket's
// (key, index) pairs decide the rest, larger keys first, ties to the lower indices.
// The branches are rare (about k of n elements take them), so they cost little.
void select_with_histogram(const float* u, int64_t n, int64_t k, const std::array<int64_t, kBuckets>& hist,
                           std::vector<int64_t>& indices) {
  int64_t above = 0;
  int bucket = kBuckets - 1;
  for (; bucket >= 0; --bucket) {
    if (above + hist[bucket] >= k) break;
    above += hist[bucket];
  }
  std::vector<int64_t> sure;
  sure.reserve(above);
  std::vector<std::pair<uint32_t, int64_t>> candidates;
  candidates.reserve(hist[bucket]);
  const uint32_t boundary = static_cast<uint32_t>(bucket);
  const uint32_t lowest = boundary << kDigitShift;
  auto visit = [&](int64_t i) {
    const uint32_t key = math::magnitude_key(u[i]);
    if ((key >> kDigitShift) > boundary) {
      sure.push_back(i);
    } else if ((key >> kDigitShift) == boundary) {
      candidates.emplace_back(key, i);
    }
  };
  // Blocks of 16 with no key in range are skipped after one vectorizable test.
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint32_t any = 0;
    for (int j = 0; j < 16; ++j) any |= math::magnitude_key(u[i + j]) >= lowest;
    if (any) {
      for (int j = 0; j < 16; ++j) visit(i + j);
    }
  }
  for (; i < n; ++i) visit(i);
  // The need-th largest candidate key, then the candidates above it and the first ties,
  // read in index order (they were collected in it), so no sort is needed.
  const int64_t need = k - above;  // 1 <= need <= candidates.size()
  auto [threshold, ties] = boundary_of(candidates, need);
  std::vector<int64_t> chosen;
  chosen.reserve(need);
  for (const auto& [key, index] : candidates) {
    if (key > threshold || (key == threshold && ties-- > 0)) chosen.push_back(index);
  }
  indices.resize(sure.size() + chosen.size());
  std::merge(sure.begin(), sure.end(), chosen.begin(), chosen.end(), indices.begin());
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");

// The pass of select_in_one_pass over whole blocks of 8, eight lanes at a time: makes u
// = x + residual in place (with a residual; the same sums as the scalar code, addition
// commutes), and calls take(i) for every i whose key is at or above `lowest`, in index
// order. Returns how many elements it covered.
template <bool kWithResidual, typename Take>
__attribute__((target("avx2"))) int64_t keys_at_or_above_avx2(const float* x, float* residual, int64_t n,
                                                              uint32_t lowest, Take&& take) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  // Keys are below 2^31, so a signed compare with lowest − 1 (−1 when lowest is 0) is key >= lowest.
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(lowest - 1u));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 u = _mm256_loadu_ps(x + i);
    if constexpr (kWithResidual) {
      u = _mm256_add_ps(_mm256_loadu_ps(residual + i), u);
      _mm256_storeu_ps(residual + i, u);
    }
    const __m256i key = _mm256_and_si256(_mm256_castps_si256(u), magnitude);
    auto hits = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, below))));
    while (hits) {
      take(i + __builtin_ctz(hits));
      hits &= hits - 1;
    }
  }
  return i;
}

// The first try of select_topk, one pass instead of two: the pass makes u (with a
// residual) and collects the (key, index) pairs at or above sampled_threshold. If that
// kept fewer than k (the estimate was too high) or far more (too low), it returns false
// and select_topk falls back to the histogram. `u_made` says whether the residual
// already holds u.
bool select_in_one_pass(const float* x, float* residual, int64_t n, int64_t k, std::vector<int64_t>& indices,
                        bool& u_made) {
  u_made = false;
  const std::optional<uint32_t> threshold = sampled_threshold(x, residual, n, k);
  if (!threshold) return false;
  const uint32_t lowest = *threshold;
  const size_t cap = static_cast<size_t>(candidate_cap(k));
  std::vector<std::pair<uint32_t, int64_t>> candidates;
  candidates.reserve(std::min<size_t>(cap, static_cast<size_t>(2 * k + 1024)));
  bool overflow = false;
  const float* u = residual ? residual : x;
  auto visit = [&](int64_t i) {
    const uint32_t key = math::magnitude_key(u[i]);
    if (key >= lowest && !overflow) {
      candidates.emplace_back(key, i);
      overflow = candidates.size() > cap;
    }
  };
  int64_t i = 0;
  if (kHasAvx2) {
    i = residual ? keys_at_or_above_avx2<true>(x, residual, n, lowest, visit)
                 : keys_at_or_above_avx2<false>(x, residual, n, lowest, visit);
  }
  for (; i + 16 <= n; i += 16) {
    uint32_t any = 0;
    if (residual) {
      for (int j = 0; j < 16; ++j) {
        residual[i + j] += x[i + j];
        any |= math::magnitude_key(residual[i + j]) >= lowest;
      }
    } else {
      for (int j = 0; j < 16; ++j) any |= math::magnitude_key(x[i + j]) >= lowest;
    }
    if (any) {
      for (int j = 0; j < 16; ++j) visit(i + j);
    }
  }
  for (; i < n; ++i) {
    if (residual) residual[i] += x[i];
    visit(i);
  }
  u_made = residual != nullptr;
  return select_from_candidates(candidates, k, indices);
}

}  // namespace

int64_t candidate_cap(int64_t k) { return 4 * k + 4096; }

bool select_from_candidates(const std::vector<std::pair<uint32_t, int64_t>>& candidates, int64_t k,
                            std::vector<int64_t>& indices) {
  const auto count = static_cast<int64_t>(candidates.size());
  if (k <= 0 || count < k || count > candidate_cap(k)) return false;
  auto [threshold, ties] = boundary_of(candidates, k);
  indices.clear();
  indices.reserve(k);
  for (const auto& [key, index] : candidates) {
    if (key > threshold || (key == threshold && ties-- > 0)) indices.push_back(index);
  }
  return true;
}

void select_topk(const float* x, float* residual, int64_t n, int64_t k, std::vector<int64_t>& indices) {
  indices.clear();
  if (residual && (k <= 0 || k >= n)) {
    for (int64_t i = 0; i < n; ++i) residual[i] += x[i];
  }
  if (k <= 0 || n <= 0) return;
  if (k >= n) {
    indices.resize(n);
    for (int64_t i = 0; i < n; ++i) indices[i] = i;
    return;
  }
  bool u_made = false;
  if (select_in_one_pass(x, residual, n, k, indices, u_made)) return;
  // The histogram method; it makes u itself unless the first try already did.
  const float* u = residual ? residual : x;
  const auto hist = u_made ? digit_histogram(u, nullptr, n) : digit_histogram(x, residual, n);
  select_with_histogram(u, n, k, hist, indices);
}

void select_topk_approx(const float* x, float* residual, int64_t n, int64_t k, std::vector<int64_t>& indices) {
  indices.clear();
  const int64_t sample = std::min<int64_t>(n, std::max<int64_t>(n / 100, 4096));
  if (k <= 0 || k >= n || sample == n) return select_topk(x, residual, n, k, indices);
  // The threshold: the k·sample/n-th largest of a contiguous block from the middle (u
  // there made first), then one pass that makes u elsewhere and keeps keys at or above it.
  const int64_t begin = (n - sample) / 2, end = begin + sample;
  if (residual) {
    for (int64_t i = begin; i < end; ++i) residual[i] += x[i];
  }
  const float* u = residual ? residual : x;
  const int64_t k_sample = std::max<int64_t>(1, (k * sample + n - 1) / n);
  std::vector<int64_t> in_sample;
  select_with_histogram(u + begin, sample, k_sample, digit_histogram(u + begin, nullptr, sample), in_sample);
  uint32_t threshold = UINT32_MAX;
  for (int64_t i : in_sample) threshold = std::min(threshold, math::magnitude_key(u[begin + i]));
  indices.reserve(k + k / 4);
  if (residual) {  // u outside the sample, made in place before the filter reads it
    for (int64_t i = 0; i < begin; ++i) residual[i] += x[i];
    for (int64_t i = end; i < n; ++i) residual[i] += x[i];
  }
  const auto keep = [&](int64_t i) { indices.push_back(i); };
  int64_t i = kHasAvx2 ? keys_at_or_above_avx2<false>(u, nullptr, n, threshold, keep) : 0;
  for (; i + 16 <= n; i += 16) {
    uint32_t any = 0;
    for (int j = 0; j < 16; ++j) any |= math::magnitude_key(u[i + j]) >= threshold;
    if (any) {
      for (int j = 0; j < 16; ++j) {
        if (math::magnitude_key(u[i + j]) >= threshold) indices.push_back(i + j);
      }
    }
  }
  for (; i < n; ++i) {
    if (math::magnitude_key(u[i]) >= threshold) indices.push_back(i);
  }
  if (indices.empty()) select_topk(u, nullptr, n, k, indices);  // the sample missed everything
}

std::vector<MagnitudeSums> top_magnitude_sums(const float* x, int64_t n, const std::vector<int64_t>& ks) {
  // The sign-cleared bits order like the magnitudes (x is finite).
  std::vector<uint32_t> keys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) keys[static_cast<size_t>(i)] = math::magnitude_key(x[i]);
  std::vector<int64_t> cuts = ks;
  cuts.push_back(0);
  cuts.push_back(n);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  // Largest cut first: each partition then runs within the previous one's front part.
  for (size_t c = cuts.size() - 1; c-- > 1;) {
    std::nth_element(keys.begin(), keys.begin() + cuts[c], keys.begin() + cuts[c + 1], std::greater<uint32_t>());
  }
  // Per segment [cuts[c - 1], cuts[c]): the sum of magnitudes and of their squares.
  std::vector<double> sums(cuts.size(), 0.0), squares(cuts.size(), 0.0);
  for (size_t c = 1; c < cuts.size(); ++c) {
    for (int64_t i = cuts[c - 1]; i < cuts[c]; ++i) {
      const double m = math::bits_float(keys[static_cast<size_t>(i)]);
      sums[c] += m;
      squares[c] += m * m;
    }
  }
  std::vector<MagnitudeSums> out;
  for (int64_t k : ks) {
    MagnitudeSums sum;
    for (size_t c = 1; c < cuts.size(); ++c) {
      if (cuts[c] <= k) {
        sum.chosen += sums[c];
        sum.chosen_squares += squares[c];
      } else {
        sum.rest_squares += squares[c];
      }
    }
    out.push_back(sum);
  }
  return out;
}

}  // namespace gradzip
