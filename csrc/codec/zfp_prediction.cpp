#include "codec/zfp_prediction.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codec/cpu_features.h"
#include "codec/error_bound.h"
#include "codec/zfp_stream.h"

// The vector helpers below are always inlined: no vector crosses a call, so GCC's note
// that such a call's ABI depends on AVX does not apply.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace gradzip {
namespace {

// Block-floating-point integers carry 30 bits below two guard bits (a float's 32-bit
// integer type less 2); the tolerance's bit plane gets 2 × (dimensions + 1) more bits.
constexpr int kIntegerBits = 32, kScaleBits = kIntegerBits - 2, kGuardBits = 4;
// Negabinary mask: the map between two's complement and negabinary.
constexpr uint32_t kNegabinary = 0xaaaaaaaau;
// IEEE single: frexp exponents of normal numbers are at least 1 − 127.
constexpr int kExponentBias = 127;
// Below this block exponent the scale 2^(30 − e) overflows a float (llnl/zfp#209).
constexpr int kLowestBlockExponent = -90;

// Eight lanes of 32 bits (GCC and Clang vector extensions: one AVX2 register, two SSE ones
// in the baseline build); lane k holds block k of a group of eight.
using f32x8 = float __attribute__((vector_size(32)));
using i32x8 = int32_t __attribute__((vector_size(32)));
using u32x8 = uint32_t __attribute__((vector_size(32)));
using f64x8 = double __attribute__((vector_size(64)));
constexpr int kLanes = 8, kGroupValues = 4 * kLanes;

// Two's complement arithmetic on 32 bits with wrap-around, as the library's int32 lifting
// compiles to; right shifts are arithmetic (floor).
[[gnu::always_inline]] inline u32x8 half(u32x8 a) { return (u32x8)((i32x8)a >> 1); }
[[gnu::always_inline]] inline i32x8 select(i32x8 mask, i32x8 a, i32x8 b) { return (a & mask) | (b & ~mask); }
[[gnu::always_inline]] inline i32x8 maximum(i32x8 a, i32x8 b) { return select(a > b, a, b); }
[[gnu::always_inline]] inline i32x8 minimum(i32x8 a, i32x8 b) { return select(a < b, a, b); }
// Powers of two from their exponents (in the normal range), without a libm call.
[[gnu::always_inline]] inline f32x8 power_of_two(i32x8 exponent) { return (f32x8)((exponent + kExponentBias) << 23); }

// The group's blocks, component j (x, y, z, w) of block k at c[j][k], from 32 values.
[[gnu::always_inline]] inline void load_transposed(const float* values, f32x8 c[4]) {
  f32x8 a[4];
  std::memcpy(a, values, sizeof a);
  const f32x8 xy01 = __builtin_shufflevector(a[0], a[1], 0, 4, 8, 12, 1, 5, 9, 13);
  const f32x8 zw01 = __builtin_shufflevector(a[0], a[1], 2, 6, 10, 14, 3, 7, 11, 15);
  const f32x8 xy23 = __builtin_shufflevector(a[2], a[3], 0, 4, 8, 12, 1, 5, 9, 13);
  const f32x8 zw23 = __builtin_shufflevector(a[2], a[3], 2, 6, 10, 14, 3, 7, 11, 15);
  c[0] = __builtin_shufflevector(xy01, xy23, 0, 1, 2, 3, 8, 9, 10, 11);
  c[1] = __builtin_shufflevector(xy01, xy23, 4, 5, 6, 7, 12, 13, 14, 15);
  c[2] = __builtin_shufflevector(zw01, zw23, 0, 1, 2, 3, 8, 9, 10, 11);
  c[3] = __builtin_shufflevector(zw01, zw23, 4, 5, 6, 7, 12, 13, 14, 15);
}

// The inverse: 32 values in block order.
[[gnu::always_inline]] inline void store_transposed(const f32x8 c[4], float* values) {
  const f32x8 xy_low = __builtin_shufflevector(c[0], c[1], 0, 8, 1, 9, 2, 10, 3, 11);
  const f32x8 zw_low = __builtin_shufflevector(c[2], c[3], 0, 8, 1, 9, 2, 10, 3, 11);
  const f32x8 xy_high = __builtin_shufflevector(c[0], c[1], 4, 12, 5, 13, 6, 14, 7, 15);
  const f32x8 zw_high = __builtin_shufflevector(c[2], c[3], 4, 12, 5, 13, 6, 14, 7, 15);
  const f32x8 a[4] = {__builtin_shufflevector(xy_low, zw_low, 0, 1, 8, 9, 2, 3, 10, 11),
                      __builtin_shufflevector(xy_low, zw_low, 4, 5, 12, 13, 6, 7, 14, 15),
                      __builtin_shufflevector(xy_high, zw_high, 0, 1, 8, 9, 2, 3, 10, 11),
                      __builtin_shufflevector(xy_high, zw_high, 4, 5, 12, 13, 6, 7, 14, 15)};
  std::memcpy(values, a, sizeof a);
}

// Predicts a group of eight blocks (in[j][k]: component j of block k) into out. Returns
// a mask of the blocks outside the prediction (lanes of all ones).
//  1. The block exponent e: the frexp exponent of the largest magnitude, at least −126;
//     −127 for a block of zeros. Bit planes kept: e − minimum_exponent + 4, in [0, 64];
//     none (or e = −127) and ZFP writes an all-zero block.
//  2. The cast: each value times 2^(30 − e), truncated to int32.
//  3. ZFP's non-orthogonal forward transform 1/16 × (4 4 4 4; 5 1 −1 −5; −4 4 4 −4;
//     −2 6 −6 2), as integer lifting steps.
//  4. Each coefficient in negabinary with the planes below the kept ones cleared, and back.
//  5. The inverse transform 1/4 × (4 6 −4 −1; 4 2 4 5; 4 −2 4 −5; 4 −6 −4 1), the lifting
//     steps undone in reverse order; each integer to float, times 2^(e − 30).
[[gnu::always_inline]] inline i32x8 predict_group(const f32x8 in[4], int32_t minimum_exponent, f32x8 out[4]) {
  // Magnitudes compare as their bit patterns.
  const i32x8 magnitude_mask = i32x8{} + 0x7fffffff;
  const i32x8 largest = maximum(maximum((i32x8)in[0] & magnitude_mask, (i32x8)in[1] & magnitude_mask),
                                maximum((i32x8)in[2] & magnitude_mask, (i32x8)in[3] & magnitude_mask));
  const i32x8 e = maximum((largest >> 23) - (kExponentBias - 1), i32x8{} + (1 - kExponentBias)) + (largest == 0);
  const i32x8 planes = minimum(maximum(e - minimum_exponent + kGuardBits, i32x8{}), i32x8{} + 64);
  const i32x8 zero = (planes == 0) | (e == -kExponentBias);
  const i32x8 declined = ~zero & (e < kLowestBlockExponent);
  const i32x8 scaled = maximum(e, i32x8{} + kLowestBlockExponent);  // an exponent the scale can hold
  const f32x8 scale = power_of_two(kScaleBits - scaled), unscale = power_of_two(scaled - kScaleBits);
  u32x8 x = (u32x8)__builtin_convertvector(scale * in[0], i32x8), y = (u32x8)__builtin_convertvector(scale * in[1], i32x8),
        z = (u32x8)__builtin_convertvector(scale * in[2], i32x8), w = (u32x8)__builtin_convertvector(scale * in[3], i32x8);
  x = half(x + w), w -= x;
  z = half(z + y), y -= z;
  x = half(x + z), z -= x;
  w = half(w + y), y -= w;
  w += half(y), y -= half(w);
  const u32x8 kept = (u32x8{} + ~uint32_t{0}) << (u32x8)minimum(maximum(kIntegerBits - planes, i32x8{}), i32x8{} + 31);
  for (u32x8* c : {&x, &y, &z, &w}) *c = ((((*c + kNegabinary) ^ kNegabinary) & kept) ^ kNegabinary) - kNegabinary;
  y += half(w), w -= half(y);
  y += w, w = (w << 1) - y;
  z += x, x = (x << 1) - z;
  y += z, z = (z << 1) - y;
  w += x, x = (x << 1) - w;
  const u32x8 c[4] = {x, y, z, w};
  for (int j = 0; j < 4; ++j) out[j] = (f32x8)((i32x8)(unscale * __builtin_convertvector((i32x8)c[j], f32x8)) & ~zero);
  return declined;
}

// Whether any lane of a mask is set.
template <typename Mask>
[[gnu::always_inline]] inline bool any(Mask mask) {
  auto lanes = mask[0];
  for (size_t k = 1; k < sizeof(Mask) / sizeof(lanes); ++k) lanes |= mask[k];
  return lanes != 0;
}

// Predicts values[0..n) group by group, the last group from a copy with ZFP's padding of a
// partial block ((a a a a), (a b b a), (a b c a)) and zero blocks after it, handing each
// group to sink(in, out, first, count). False where a block lies outside the prediction.
template <typename Sink>
[[gnu::always_inline]] inline bool predict_field(const float* values, int64_t n, int32_t minimum_exponent, Sink& sink) {
  f32x8 in[4], out[4];
  i32x8 declined{};
  int64_t i = 0;
  for (; i + kGroupValues <= n; i += kGroupValues) {
    load_transposed(values + i, in);
    declined |= predict_group(in, minimum_exponent, out);
    sink(in, out, i, kGroupValues);
  }
  if (const int64_t rest = n - i; rest > 0) {
    float last[kGroupValues] = {};
    std::copy(values + i, values + n, last);
    if (const int64_t r = rest % 4; r > 0) {
      float* v = last + (rest - r);
      v[1] = r > 1 ? v[1] : v[0], v[2] = r > 2 ? v[2] : v[1], v[3] = v[0];
    }
    load_transposed(last, in);
    declined |= predict_group(in, minimum_exponent, out);
    sink(in, out, i, static_cast<int>(rest));
  }
  return !any(declined);
}

// Sinks: the predictions themselves, or the indices of the values they leave outside a bound.
struct CopyPredictions {
  float* out;
  [[gnu::always_inline]] void operator()(const f32x8*, const f32x8* predicted, int64_t first, int count) const {
    float values[kGroupValues];
    store_transposed(predicted, values);
    std::memcpy(out + first, values, static_cast<size_t>(count) * sizeof(float));
  }
};

struct CollectOutside {
  double bound;
  std::vector<uint64_t>* outside;
  // A group whose every difference is below the bound in double is inside; otherwise each
  // value is decided exactly (within_bound), in index order.
  [[gnu::always_inline]] void operator()(const f32x8* in, const f32x8* predicted, int64_t first, int count) const {
    decltype(f64x8{} < 0.0) beyond{};
    for (int j = 0; j < 4; ++j) {
      const f64x8 d = __builtin_convertvector(predicted[j], f64x8) - __builtin_convertvector(in[j], f64x8);
      beyond |= ~((d < bound) & (-d < bound));
    }
    if (!any(beyond)) return;
    for (int i = 0; i < count; ++i) {
      if (!within_bound(predicted[i % 4][i / 4], in[i % 4][i / 4], bound)) {
        outside->push_back(static_cast<uint64_t>(first + i));
      }
    }
  }
};

template <typename Sink>
bool predict_baseline(const float* values, int64_t n, int32_t minimum_exponent, Sink& sink) {
  return predict_field(values, n, minimum_exponent, sink);
}

// The same loops compiled for AVX2.
template <typename Sink>
__attribute__((target("avx2"))) bool predict_avx2(const float* values, int64_t n, int32_t minimum_exponent, Sink& sink) {
  return predict_field(values, n, minimum_exponent, sink);
}

// The library's decode of values[0..n) at a tolerance.
std::vector<float> library_round_trip(std::vector<float> values, double tolerance) {
  const int64_t n = static_cast<int64_t>(values.size());
  ZfpStream encoder(values.data(), n, kZfpAccuracy, tolerance);
  std::vector<uint8_t> stream(encoder.maximum_bytes());
  encoder.compress(stream.data(), stream.size());
  std::vector<float> decoded(values.size());
  ZfpStream decoder(decoded.data(), n, kZfpAccuracy, tolerance);
  decoder.decompress(stream.data(), stream.size());
  return decoded;
}

// Fields that reach every branch of the prediction: for block exponents from 8 below the
// tolerance's plane to 40 above, magnitudes spread over 30 octaves, values at the block
// exponent's edges, signs, zeros, subnormals, and every length of a last partial block.
bool matches_library() {
  std::mt19937 rng(20261127);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int compared = 0;
  for (int span = -8; span <= 40; ++span) {
    for (const int minimum_exponent : {-133, -60, -24, -7, 0, 9}) {
      const double tolerance = std::ldexp(1.0 + unit(rng), minimum_exponent);
      const int top = std::min(minimum_exponent + span, 127);
      std::vector<float> values(256 + static_cast<size_t>(span + 8) % 4);
      for (size_t i = 0; i < values.size(); ++i) {
        double magnitude;
        switch (i % 8) {
          case 0: magnitude = std::ldexp(unit(rng), top); break;
          case 1: magnitude = std::ldexp(unit(rng), top - static_cast<int>(rng() % 31)); break;
          case 2: magnitude = std::ldexp(1.0, top - 1); break;
          case 3: magnitude = std::ldexp(1.0 - std::ldexp(unit(rng), -24), top); break;
          case 4: magnitude = 0.0; break;
          case 5: magnitude = std::ldexp(unit(rng), -140); break;
          default: magnitude = std::ldexp(unit(rng), top - static_cast<int>(rng() % 8)); break;
        }
        float v = static_cast<float>(magnitude);
        if (!std::isfinite(v)) v = std::numeric_limits<float>::max();
        values[i] = rng() % 2 ? v : -v;
      }
      std::vector<float> predicted(values.size());
      if (!predict_zfp_accuracy_decode(values.data(), static_cast<int64_t>(values.size()), tolerance, predicted.data())) {
        continue;  // outside the prediction: the codec decodes such fields
      }
      const std::vector<float> decoded = library_round_trip(values, tolerance);
      if (std::memcmp(predicted.data(), decoded.data(), values.size() * sizeof(float)) != 0) return false;
      ++compared;
    }
  }
  return compared > 0;
}

// The plane the tolerance sets: 2^e ≤ tolerance < 2^(e + 1).
int32_t minimum_exponent(double tolerance) {
  int e;
  std::frexp(tolerance, &e);
  return e - 1;
}

template <typename Sink>
bool predict(const float* values, int64_t n, double tolerance, Sink& sink) {
  const int32_t e = minimum_exponent(tolerance);
  return kHasAvx2 ? predict_avx2(values, n, e, sink) : predict_baseline(values, n, e, sink);
}

}  // namespace

bool predict_zfp_accuracy_decode(const float* values, int64_t n, double tolerance, float* out) {
  CopyPredictions sink{out};
  return predict(values, n, tolerance, sink);
}

bool zfp_values_outside_bound(const float* values, int64_t n, double bound, std::vector<uint64_t>& outside) {
  CollectOutside sink{bound, &outside};
  return predict(values, n, bound, sink);
}

bool zfp_prediction_matches_library() {
  static const bool matches = matches_library();
  return matches;
}

}  // namespace gradzip
