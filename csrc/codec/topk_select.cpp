#include "codec/topk_select.h"

#include <algorithm>
#include <array>

#include "element_math.cuh"

namespace gradzip {
namespace {

constexpr int kDigitShift = 20;  // keys are < 2^31: bits 30..20 are the 11-bit digit
constexpr int kBuckets = 1 << 11;

struct Threshold {
  uint32_t key;     // the k-th largest magnitude key
  int64_t greater;  // how many keys are strictly greater
};

// The k-th largest magnitude key (1 <= k <= n), and how many keys exceed it.
Threshold kth_largest_key(const float* x, int64_t n, int64_t k) {
  // Four histograms, merged afterwards, so neighbouring equal digits do not serialize.
  std::vector<std::array<int64_t, kBuckets>> hist(4);
  for (auto& h : hist) h.fill(0);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) ++hist[j][math::magnitude_key(x[i + j]) >> kDigitShift];
  }
  for (; i < n; ++i) ++hist[0][math::magnitude_key(x[i]) >> kDigitShift];

  int64_t above = 0;
  int bucket = kBuckets - 1;
  for (; bucket >= 0; --bucket) {
    const int64_t count = hist[0][bucket] + hist[1][bucket] + hist[2][bucket] + hist[3][bucket];
    if (above + count >= k) break;
    above += count;
  }
  std::vector<uint32_t> candidates;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t key = math::magnitude_key(x[j]);
    if (static_cast<int>(key >> kDigitShift) == bucket) candidates.push_back(key);
  }
  const int64_t need = k - above;  // 1 <= need <= candidates.size()
  std::nth_element(candidates.begin(), candidates.begin() + (need - 1), candidates.end(), std::greater<>());
  const uint32_t key = candidates[need - 1];
  const int64_t greater_in_bucket = std::count_if(candidates.begin(), candidates.end(),
                                                  [key](uint32_t c) { return c > key; });
  return {key, above + greater_in_bucket};
}

// Every index with key > threshold, then the first `ties` indices with key == threshold,
// merged into ascending order.
void filter(const float* x, int64_t n, uint32_t threshold, int64_t ties, std::vector<int64_t>& indices) {
  indices.resize(n);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    indices[count] = i;
    count += math::magnitude_key(x[i]) > threshold;
  }
  indices.resize(count);
  if (ties <= 0) return;
  std::vector<int64_t> equal;
  equal.reserve(ties);
  for (int64_t i = 0; i < n && static_cast<int64_t>(equal.size()) < ties; ++i) {
    if (math::magnitude_key(x[i]) == threshold) equal.push_back(i);
  }
  std::vector<int64_t> merged(indices.size() + equal.size());
  std::merge(indices.begin(), indices.end(), equal.begin(), equal.end(), merged.begin());
  indices.swap(merged);
}

}  // namespace

void select_topk(const float* x, int64_t n, int64_t k, std::vector<int64_t>& indices) {
  indices.clear();
  if (k <= 0 || n <= 0) return;
  if (k >= n) {
    indices.resize(n);
    for (int64_t i = 0; i < n; ++i) indices[i] = i;
    return;
  }
  const Threshold t = kth_largest_key(x, n, k);
  filter(x, n, t.key, k - t.greater, indices);
}

void select_topk_approx(const float* x, int64_t n, int64_t k, std::vector<int64_t>& indices) {
  indices.clear();
  if (k <= 0 || n <= 0) return;
  const int64_t sample = std::min<int64_t>(n, std::max<int64_t>(n / 100, 4096));
  if (sample == n) return select_topk(x, n, k, indices);
  // A contiguous block from the middle: one cache-friendly read of 1%.
  const float* block = x + (n - sample) / 2;
  const int64_t k_sample = std::max<int64_t>(1, (k * sample + n - 1) / n);
  const uint32_t threshold = kth_largest_key(block, sample, k_sample).key;
  // Keys >= threshold: filter with threshold - 1 and no ties.
  filter(x, n, threshold == 0 ? 0 : threshold - 1, 0, indices);
  if (indices.empty()) select_topk(x, n, k, indices);  // the sample missed everything
}

}  // namespace gradzip
