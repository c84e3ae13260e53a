#include "codec/polar_code.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

namespace gradzip::polar {

namespace {

void check_m(int m) {
  if (m < 0 || m > kMaxM) {
    throw std::invalid_argument("polar: m = " + std::to_string(m) + " is outside [0, " + std::to_string(kMaxM) + "]");
  }
}

// ln(x) for x > 0 from + − × ÷ only, each rounded as IEEE 754 says, so that every
// machine (and the compiler, in a constant expression) gets the same bits; libm's log
// may differ in the last place.
constexpr double log_e(double x) {
  int e = 0;
  for (; x >= 1.4142135623730951; x /= 2) ++e;  // exact: x stays normal
  for (; x < 0.70710678118654752; x *= 2) --e;
  const double s = (x - 1) / (x + 1), s2 = s * s;  // ln x = 2·atanh(s), |s| < 0.172
  double term = s, sum = 0;
  for (int k = 1; k <= 41; k += 2) {
    sum += term / k;
    term *= s2;
  }
  return e * 0.69314718055994531 + 2 * sum;
}

double binary_entropy(double p) {
  if (p <= 0 || p >= 1) return 0;
  return -(p * log_e(p) + (1 - p) * log_e(1 - p)) / 0.69314718055994531;
}

// LLRs are integers in 1/kLlrScale nat.
constexpr int kLlrScale = 64;
// |LLR| of a source bit is at most this, so that 2^kMaxM of them fit in int32 (32 nat).
constexpr int kMaxLeafLlr = 2047;

// |LLR| of a source bit under BSC(D) at the code's rate.
int leaf_llr(int m, int free_count) {
  const double d = rate_distortion_bound(static_cast<double>(free_count) / static_cast<double>(1 << m));
  if (d <= 0) return kMaxLeafLlr;
  return static_cast<int>(std::min<double>(kMaxLeafLlr, std::round(kLlrScale * log_e((1 - d) / d))));
}

// kCorrection[k] = round(64·ln(1 + e^{−k/64})) for k <= kLastCorrection, the first k
// where it is 0. Every value is at least 0.001 from a rounding boundary, so the errors
// of the series here (or of any libm) cannot change a bit of it.
constexpr int kLastCorrection = 311;
constexpr auto kCorrection = [] {
  std::array<uint8_t, kLastCorrection + 1> table{};
  double power = 1;  // e^{−k/64}
  for (int k = 0; k <= kLastCorrection; ++k) {
    table[k] = static_cast<uint8_t>(kLlrScale * log_e(1 + power) + 0.5);
    power *= 0.9844964370054085;  // e^{−1/64}
  }
  return table;
}();
static_assert(kCorrection[0] == 44 && kCorrection[37] == 28 && kCorrection[200] == 3 && kCorrection[310] == 1 &&
              kCorrection[kLastCorrection] == 0);

inline int32_t correction(int32_t k) { return kCorrection[std::min(k, kLastCorrection)]; }

// LLR of a ⊕ b from the LLRs of a and b:
// sign(a)·sign(b)·(min(|a|, |b|) + ln(1 + e^{−(|a| + |b|)}) − ln(1 + e^{−||a| − |b||})).
inline int32_t boxplus(int32_t a, int32_t b) {
  const int32_t x = a < 0 ? -a : a, y = b < 0 ? -b : b;
  const int32_t magnitude = std::min(x, y) + correction(x + y) - correction(x > y ? x - y : y - x);
  return (a ^ b) < 0 ? -magnitude : magnitude;
}

// SC with one path on a node of 2^Level bits, unrolled: reads its LLRs, writes its x.
template <int Level>
void sc_small(const int32_t* in, const uint8_t* frozen, uint8_t* x) {
  if constexpr (Level == 0) {
    x[0] = !frozen[0] && in[0] < 0;
  } else {
    constexpr int half = 1 << (Level - 1);
    int32_t child[half];
    uint8_t left[half], right[half];
    for (int i = 0; i < half; ++i) child[i] = boxplus(in[i], in[half + i]);
    sc_small<Level - 1>(child, frozen, left);
    for (int i = 0; i < half; ++i) child[i] = in[half + i] + (left[i] ? -in[i] : in[i]);
    sc_small<Level - 1>(child, frozen + half, right);
    for (int i = 0; i < half; ++i) {
      x[i] = left[i] ^ right[i];
      x[half + i] = right[i];
    }
  }
}

// --- Frozen-set design --------------------------------------------------------------------

// A binary-input symmetric channel as output classes: an output y with W(y|0) = a >=
// W(y|1) = b, and its mirror image with a and b swapped; root = √(ab). The a + b of all
// classes sum to 1, and the Bhattacharyya parameter is Σ 2·root.
struct OutputClass {
  double a, b, root;
};

constexpr int kDesignClasses = 4;
constexpr int kPolarizedClasses = kDesignClasses * (kDesignClasses + 1);

// The classes of W− (plus = false) or W+ from the `count` classes of W: for each
// unordered pair of classes (p, q), counted twice when p ≠ q,
//   W−: (a_p a_q + b_p b_q, a_p b_q + b_p a_q)
//   W+: (a_p a_q, b_p b_q) and the larger and smaller of a_p b_q and b_p a_q.
// Classes of zero probability are left out. Returns how many it wrote.
int polarize(const OutputClass* w, int count, bool plus, OutputClass* out) {
  int written = 0;
  auto put = [&](double a, double b) {
    if (a > 0) out[written++] = {a, b, std::sqrt(a * b)};
  };
  for (int p = 0; p < count; ++p) {
    for (int q = p; q < count; ++q) {
      const double times = p == q ? 1 : 2;
      const OutputClass& x = w[p];
      const OutputClass& y = w[q];
      if (!plus) {
        put(times * (x.a * y.a + x.b * y.b), times * (x.a * y.b + x.b * y.a));
      } else {
        put(times * (x.a * y.a), times * (x.b * y.b));
        const double s = x.a * y.b, t = x.b * y.a;
        put(times * std::max(s, t), times * std::min(s, t));
      }
    }
  }
  return written;
}

// Degrades the `count` classes in w to at most kDesignClasses (Tal & Vardy's merge):
// sorts them by likelihood ratio b / a, then merges the adjacent pair that raises the
// Bhattacharyya parameter least, the lower position on a tie, until few enough are
// left. Returns the count left.
int merge_classes(OutputClass* w, int count) {
  std::sort(w, w + count, [](const OutputClass& x, const OutputClass& y) {
    const double rx = x.b / x.a, ry = y.b / y.a;
    if (rx != ry) return rx < ry;
    return x.a != y.a ? x.a < y.a : x.b < y.b;
  });
  // merged[i]: the root of classes i and i + 1 merged; cost[i]: what merging them adds.
  double merged[kPolarizedClasses], cost[kPolarizedClasses];
  auto pair_up = [&](int i) {
    merged[i] = std::sqrt((w[i].a + w[i + 1].a) * (w[i].b + w[i + 1].b));
    cost[i] = merged[i] - w[i].root - w[i + 1].root;
  };
  for (int i = 0; i + 1 < count; ++i) pair_up(i);
  for (; count > kDesignClasses; --count) {
    const int i = static_cast<int>(std::min_element(cost, cost + count - 1) - cost);
    w[i] = {w[i].a + w[i + 1].a, w[i].b + w[i + 1].b, merged[i]};
    std::copy(w + i + 2, w + count, w + i + 1);
    std::copy(merged + i + 1, merged + count - 1, merged + i);
    std::copy(cost + i + 1, cost + count - 1, cost + i);
    if (i + 2 < count) pair_up(i);
    if (i > 0) pair_up(i - 1);
  }
  return count;
}

// Bhattacharyya parameter of each of the N synthetic channels of BSC(d). Channel i's
// top index bit picks the first step from the raw channel (0: minus, 1: plus).
std::vector<double> design(int m, double d) {
  const int n = 1 << m;
  std::vector<double> z(n);
  if (m == 0) {
    z[0] = 2 * std::sqrt(d * (1 - d));
    return z;
  }
  // The channels after l steps, kDesignClasses slots each, and how many slots they use.
  std::vector<OutputClass> level(kDesignClasses), next;
  std::vector<int> counts{1}, next_counts;
  level[0] = {1 - d, d, std::sqrt(d * (1 - d))};
  OutputClass w[kPolarizedClasses];
  for (int l = 0; l < m; ++l) {
    const int channels = 1 << l;
    const bool last = l == m - 1;
    next.resize(static_cast<size_t>(2 * channels) * kDesignClasses);
    next_counts.resize(2 * channels);
    for (int c = 0; c < channels; ++c) {
      for (int plus = 0; plus < 2; ++plus) {
        const int child = 2 * c + plus;
        int count = polarize(&level[static_cast<size_t>(c) * kDesignClasses], counts[c], plus, w);
        if (last) {
          double sum = 0;
          for (int i = 0; i < count; ++i) sum += w[i].root;
          z[child] = 2 * sum;
          continue;
        }
        count = merge_classes(w, count);
        std::copy(w, w + count, next.begin() + static_cast<size_t>(child) * kDesignClasses);
        next_counts[child] = count;
      }
    }
    level.swap(next);
    counts.swap(next_counts);
  }
  return z;
}

}  // namespace

double rate_distortion_bound(double rate) {
  if (rate <= 0) return 0.5;
  if (rate >= 1) return 0;
  double lo = 0, hi = 0.5;
  for (int i = 0; i < 64; ++i) {
    const double mid = (lo + hi) / 2;
    (binary_entropy(mid) < 1 - rate ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

std::vector<uint8_t> frozen_mask(int m, int free_count) {
  check_m(m);
  const int n = 1 << m;
  if (free_count < 0 || free_count > n) {
    throw std::invalid_argument("polar: free_count = " + std::to_string(free_count) + " is outside [0, " +
                                std::to_string(n) + "]");
  }
  const std::vector<double> z = design(m, rate_distortion_bound(static_cast<double>(free_count) / n));
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  const auto frozen_end = order.begin() + (n - free_count);
  std::nth_element(order.begin(), frozen_end, order.end(), [&](int i, int j) { return z[i] != z[j] ? z[i] > z[j] : i < j; });
  std::vector<uint8_t> mask(n, 0);
  for (auto it = order.begin(); it != frozen_end; ++it) mask[*it] = 1;
  return mask;
}

void transform(uint8_t* bits, int m) {
  check_m(m);
  const int n = 1 << m;
  int half = 1;
  if (m >= 3) {
    // The first three steps on eight bytes at a time: byte j ^= byte j + h for j % 2h < h.
    constexpr bool little = std::endian::native == std::endian::little;
    constexpr uint64_t mask[3] = {little ? 0x00ff00ff00ff00ffu : 0xff00ff00ff00ff00u,
                                  little ? 0x0000ffff0000ffffu : 0xffff0000ffff0000u,
                                  little ? 0x00000000ffffffffu : 0xffffffff00000000u};
    for (int i = 0; i < n; i += 8) {
      uint64_t w;
      std::memcpy(&w, bits + i, 8);
      for (int step = 0; step < 3; ++step) {
        const int shift = 8 << step;
        w ^= (little ? w >> shift : w << shift) & mask[step];
      }
      std::memcpy(bits + i, &w, 8);
    }
    half = 8;
  }
  for (; half < n; half *= 2) {
    for (int start = 0; start < n; start += 2 * half) {
      uint8_t* a = bits + start;
      const uint8_t* b = a + half;
      for (int i = 0; i < half; ++i) a[i] ^= b[i];
    }
  }
}

Encoder::Encoder(int m, int list_size) : m_(m), list_size_(list_size) {
  check_m(m);
  if (list_size < 1) throw std::invalid_argument("polar: list_size must be at least 1");
  const size_t rows = static_cast<size_t>(list_size);
  alpha_.resize(m + 1);
  bits_.resize(m + 1);
  from_left_.resize(m + 1);
  from_right_.resize(m + 1);
  for (int l = 0; l <= m; ++l) {
    alpha_[l].resize(l == m ? (size_t{1} << l) : rows << l);  // the root has one path
    bits_[l].resize(l == m ? rows << l : 2 * (rows << l));
    from_left_[l].resize(rows);
    from_right_[l].resize(rows);
  }
  metric_.resize(rows);
  next_metric_.resize(rows);
  candidates_.resize(2 * rows);
  u_.resize(size_t{1} << m);
}

int64_t Encoder::encode(const uint8_t* source, const uint8_t* frozen, uint8_t* free_bits_out) {
  const int n = 1 << m_;
  const int free_count = n - static_cast<int>(std::count(frozen, frozen + n, uint8_t{1}));
  if (free_count != cached_free_) {
    leaf_llr_ = leaf_llr(m_, free_count);
    cached_free_ = free_count;
  }
  frozen_ = frozen;
  const int32_t llr = leaf_llr_;
  int32_t* root = alpha_[m_].data();
  for (int i = 0; i < n; ++i) root[i] = source[i] ? -llr : llr;
  paths_ = 1;
  metric_[0] = 0;
  node(m_, 0, bits_[m_].data(), from_left_[m_].data());
  // The closest reconstruction; on a tie the more likely path, then the lower row.
  int best = 0;
  int64_t best_distance = n + 1;
  for (int p = 0; p < paths_; ++p) {
    const uint8_t* x = bits_[m_].data() + static_cast<size_t>(p) * n;
    int64_t distance = 0;
    for (int i = 0; i < n; ++i) distance += x[i] != source[i];
    if (distance < best_distance || (distance == best_distance && metric_[p] < metric_[best])) {
      best_distance = distance;
      best = p;
    }
  }
  std::memcpy(u_.data(), bits_[m_].data() + static_cast<size_t>(best) * n, n);
  transform(u_.data(), m_);
  for (int i = 0, k = 0; i < n; ++i) {
    if (!frozen[i]) free_bits_out[k++] = u_[i];
  }
  return best_distance;
}

// Runs the 2^level-bit node whose first leaf is u_first on alpha_[level] rows 0 ..
// paths_ − 1. Writes the x row of each outgoing path to x_out (2^level bytes a row) and
// the incoming row it continues to parent_out.
void Encoder::node(int level, int first, uint8_t* x_out, int* parent_out) {
  if (level == 0) return leaf(first, x_out, parent_out);
  if (list_size_ == 1 && level <= 4) {
    parent_out[0] = 0;
    const int32_t* in = alpha_[level].data();
    switch (level) {
      case 1: return sc_small<1>(in, frozen_ + first, x_out);
      case 2: return sc_small<2>(in, frozen_ + first, x_out);
      case 3: return sc_small<3>(in, frozen_ + first, x_out);
      default: return sc_small<4>(in, frozen_ + first, x_out);
    }
  }
  const size_t half = size_t{1} << (level - 1), size = 2 * half;
  const int32_t* in = alpha_[level].data();
  int32_t* child = alpha_[level - 1].data();
  uint8_t* left_x = bits_[level - 1].data();
  uint8_t* right_x = left_x + list_size_ * half;
  for (int p = 0; p < paths_; ++p) {
    const int32_t* a = in + p * size;
    int32_t* out = child + p * half;
    for (size_t i = 0; i < half; ++i) out[i] = boxplus(a[i], a[half + i]);
  }
  int* from_left = from_left_[level].data();
  node(level - 1, first, left_x, from_left);

  for (int p = 0; p < paths_; ++p) {
    const int32_t* a = in + from_left[p] * size;
    const uint8_t* bit = left_x + p * half;
    int32_t* out = child + p * half;
    for (size_t i = 0; i < half; ++i) out[i] = a[half + i] + (bit[i] ? -a[i] : a[i]);
  }
  int* from_right = from_right_[level].data();
  node(level - 1, first + static_cast<int>(half), right_x, from_right);

  for (int p = 0; p < paths_; ++p) {
    const uint8_t* left = left_x + from_right[p] * half;
    const uint8_t* right = right_x + p * half;
    uint8_t* out = x_out + p * size;
    for (size_t i = 0; i < half; ++i) {
      out[i] = left[i] ^ right[i];
      out[half + i] = right[i];
    }
    parent_out[p] = from_left[from_right[p]];
  }
}

// Decides u_index on every path. A path's metric grows by |LLR| when its bit goes
// against its LLR's sign.
void Encoder::leaf(int index, uint8_t* bit, int* parent_out) {
  const int32_t* llr = alpha_[0].data();
  if (frozen_[index] || list_size_ == 1) {
    for (int p = 0; p < paths_; ++p) {
      bit[p] = !frozen_[index] && llr[p] < 0;
      if (list_size_ > 1 && llr[p] < 0) metric_[p] -= llr[p];
      parent_out[p] = p;
    }
    return;
  }
  const int count = 2 * paths_;
  for (int p = 0; p < paths_; ++p) {
    candidates_[2 * p] = {metric_[p] + std::max(0, -llr[p]), p, 0};
    candidates_[2 * p + 1] = {metric_[p] + std::max(0, llr[p]), p, 1};
  }
  const int kept = std::min(count, list_size_);
  std::partial_sort(candidates_.begin(), candidates_.begin() + kept, candidates_.begin() + count,
                    [](const Candidate& x, const Candidate& y) {
                      if (x.metric != y.metric) return x.metric < y.metric;
                      return x.path != y.path ? x.path < y.path : x.bit < y.bit;
                    });
  for (int q = 0; q < kept; ++q) {
    next_metric_[q] = candidates_[q].metric;
    bit[q] = candidates_[q].bit;
    parent_out[q] = candidates_[q].path;
  }
  std::copy(next_metric_.begin(), next_metric_.begin() + kept, metric_.begin());
  paths_ = kept;
}

int64_t encode(const uint8_t* source, int m, const uint8_t* frozen, uint8_t* free_bits_out, int list_size) {
  return Encoder(m, list_size).encode(source, frozen, free_bits_out);
}

void decode(const uint8_t* free_bits, int m, const uint8_t* frozen, uint8_t* out) {
  check_m(m);
  const int n = 1 << m;
  for (int i = 0, k = 0; i < n; ++i) out[i] = frozen[i] ? 0 : free_bits[k++];
  transform(out, m);
}

}  // namespace gradzip::polar
