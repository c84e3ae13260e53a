// Per-element math shared by the CPU codecs (csrc/codec) and the CUDA kernels:
// __host__ __device__ inline functions on plain values (the decoders' terms also read a
// payload's words), no state.
// The CPU tests exercise them; the GPU build compiles the very same code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GZ_HD __host__ __device__ __forceinline__
#else
#define GZ_HD inline
#endif

namespace gradzip::math {

GZ_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

GZ_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// |x| as an unsigned key whose order is the order of |x| (NaN above +Inf).
GZ_HD uint32_t magnitude_key(float x) { return float_bits(x) & 0x7fffffffu; }

// 1 for Inf and NaN, the only floats whose exponent field is all ones; 0 otherwise.
GZ_HD uint32_t non_finite_bit(float x) { return static_cast<uint32_t>((float_bits(x) & 0x7F800000u) == 0x7F800000u); }

// 1 for x >= +0 (and +NaN), 0 for x <= -0 (and -NaN): the sign bit, inverted.
GZ_HD uint32_t nonnegative_bit(float x) { return (float_bits(x) >> 31) ^ 1u; }

// fp32 -> IEEE half, round to nearest even; overflow to Inf. A NaN keeps its sign and the
// top 10 bits of its payload, made quiet: x86's F16C does so (vcvtps2ph), and the CPU codec
// converts with it where the host has it, so every element is converted alike.
GZ_HD uint16_t float_to_half(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // half subnormal or zero: scale by 2^24 and round
    const float magnitude = bits_float(abs) * 16777216.0f;  // exact: a power of two
    uint32_t m = static_cast<uint32_t>(magnitude);
    const float rest = magnitude - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

GZ_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return bits_float(float_bits(magnitude) | sign);
  }
  if (exponent == 31) {  // Inf, or a NaN made quiet with its payload kept (as F16C's vcvtph2ps)
    return bits_float(sign | 0x7f800000u | (mantissa != 0 ? 0x400000u : 0u) | (mantissa << 13));
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// fp32 -> bfloat16, round to nearest even; NaN stays NaN.
GZ_HD uint16_t float_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

GZ_HD float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// Compact top-k's 16-bit values (fp16, else bf16): finite values saturate at the type's
// largest (fp16 65504, bf16 0x7F7F) instead of becoming Inf, as std::clamp does (NaN
// passes through); error feedback keeps the rest.
GZ_HD uint16_t compact_value_bits(float v, bool fp16) {
  const float largest = fp16 ? 65504.0f : 3.38953139e38f;
  const float clamped = v < -largest ? -largest : largest < v ? largest : v;
  return fp16 ? float_to_half(clamped) : float_to_bf16(clamped);
}
GZ_HD float compact_value(uint16_t bits, bool fp16) { return fp16 ? half_to_float(bits) : bf16_to_float(bits); }

// Philox4x32-10 (Salmon et al., SC'11): four 32-bit random words from a 128-bit
// counter and a 64-bit key. Counter-based, so any element's numbers can be made
// anywhere, in any order, on the CPU or the GPU alike.
struct Philox4 {
  uint32_t v[4];
};

GZ_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

GZ_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// A uniform float in [0, 1) from 24 random bits.
GZ_HD float uniform01(uint32_t bits) { return static_cast<float>(bits >> 8) * 5.9604644775390625e-8f; }

// QSGD's stochastic level of |v|/norm with s levels: floor(s·r) + 1 with probability
// s·r − floor(s·r), else floor(s·r); `u` is uniform in [0, 1). Returns 0..s (0 for a
// NaN ratio, as from a zero-norm bucket). Branch-free, so loops over it vectorize.
GZ_HD uint32_t qsgd_level(float ratio, uint32_t levels, float u) {
  const float top = static_cast<float>(levels);
  float scaled = ratio * top;
  scaled = scaled > 0.0f ? scaled : 0.0f;  // NaN compares false: 0
  scaled = scaled < top ? scaled : top;
  const int32_t low = static_cast<int32_t>(scaled);  // scaled < 2^15: exact truncation
  return static_cast<uint32_t>(low + (u < scaled - static_cast<float>(low) ? 1 : 0));
}

// QSGD's code of one element: the level in the low bits, the sign (1 = negative) in
// `sign_bit`. `inverse` is 1/‖bucket‖ (0 for a zero norm); |v| is taken from the bits.
GZ_HD uint32_t qsgd_code(float v, float inverse, uint32_t levels, uint32_t sign_bit, uint32_t random) {
  const float magnitude = bits_float(magnitude_key(v));
  return qsgd_level(magnitude * inverse, levels, uniform01(random)) | ((nonnegative_bit(v) ^ 1u) * sign_bit);
}

// Philox counter of element i of the QSGD bucket starting at `bucket_begin`: one
// philox4x32_10 call serves the four elements from bucket_begin + 4m, word (i − begin) % 4.
GZ_HD uint64_t qsgd_philox_counter(uint64_t i, uint64_t bucket_begin) { return bucket_begin + ((i - bucket_begin) & ~uint64_t{3}); }

// uniform (TFF's rule): the code of u between `low` and its tensor's max, `top` = 2^bits − 1
// levels apart by step (`inverse` = 1/step, 0 for a constant tensor), rounded up when the
// fraction reaches `up` (a uniform draw; 0.5 rounds to nearest). In double, as the decoder's
// level; a code never exceeds `top`.
GZ_HD uint32_t uniform_code(float u, float low, double inverse, uint32_t top, double up) {
  const double t = (static_cast<double>(u) - static_cast<double>(low)) * inverse;
  const double below = ::floor(t);
  const double code = below + ((t - below) >= up && t > below ? 1.0 : 0.0);
  return static_cast<uint32_t>(code < static_cast<double>(top) ? code : static_cast<double>(top));
}

// uniform's extremes as written: a zero of either sign as +0, so that the CPU (which keeps
// the first of equal values) and the GPU (which orders −0 below +0) write the same bytes.
GZ_HD float uniform_extreme(float v) { return v == 0.0f ? 0.0f : v; }

// uniform's step: (max − min) / (2^bits − 1) in double (max − min may exceed fp32's range).
GZ_HD double uniform_step(float low, float high, int bits) {
  return (static_cast<double>(high) - static_cast<double>(low)) / static_cast<double>((uint32_t{1} << bits) - 1);
}

// The value of a uniform code: low + code × step in double, rounded to float once.
GZ_HD float uniform_level(float low, uint32_t code, double step) {
  return static_cast<float>(static_cast<double>(low) + static_cast<double>(code) * step);
}

// Exact top-k selects by radix on the magnitude keys (< 2^31) in three digits, most
// significant first: bits 30..20 (2048 buckets), 19..9 (2048), 8..0 (512).
constexpr int kRadixPasses = 3;
constexpr uint32_t kRadixMaxBuckets = 2048;
GZ_HD int radix_shift(int pass) { return pass == 0 ? 20 : pass == 1 ? 9 : 0; }
GZ_HD uint32_t radix_buckets(int pass) { return pass == 2 ? 512u : 2048u; }
GZ_HD uint32_t radix_digit(uint32_t key, int pass) { return (key >> radix_shift(pass)) & (radix_buckets(pass) - 1u); }
// The key bits decided by the passes before `pass` (pass = kRadixPasses: all of them).
GZ_HD uint32_t radix_decided_mask(int pass) {
  return pass == 0 ? 0u : (0x7fffffffu >> radix_shift(pass - 1)) << radix_shift(pass - 1);
}

// Bits of one Golomb-Rice code: gap >> b one-bits, a zero-bit, b remainder bits.
GZ_HD uint64_t golomb_rice_bits(uint64_t gap, int b) { return (gap >> b) + 1u + static_cast<uint64_t>(b); }

// Golomb-Rice decoding as a state machine over single bits, so that segments of a stream
// can be decoded in parallel from every possible entry state and chained afterwards.
// State 0 reads the unary part (a one-bit stays, a zero-bit ends it); state r > 0 has r
// remainder bits left. Returns the next state and sets `completed` when the bit ends a code.
GZ_HD uint32_t rice_next_state(uint32_t state, uint32_t bit, int b, bool& completed) {
  if (state == 0) {
    completed = !bit && b == 0;
    return bit ? 0u : static_cast<uint32_t>(b);
  }
  completed = state == 1;
  return state - 1;
}

// The one-pass decoders' terms (the `_rows` decoders of cuda/sign.cu, cuda/qsgd.cu), on a payload's sections as
// typed words: element i's value scaled as the host decoder's decode_add(..., scale)
// scales it. Sign: ±(scale · its block's scale), or ±scale with block = 0 (`bits` 32
// elements to a word, 1 = non-negative).
GZ_HD float sign_decoded(const float* scales, const uint32_t* bits, uint32_t block, float scale, int64_t i) {
  const float s = block ? scale * scales[i / block] : scale;
  return ((bits[i / 32] >> (i % 32)) & 1u) ? s : -s;
}

// QSGD: element i's code of `width` bits from the packed words (LSB first; a code may
// straddle two words), decoded as ±(scale · norm / levels) · level. False, leaving
// `term` alone, when the level is above `levels`.
GZ_HD bool qsgd_decoded(const float* norms, const uint32_t* codes, int width, uint32_t levels, uint32_t bucket,
                        float scale, int64_t i, float& term) {
  const uint64_t position = static_cast<uint64_t>(i) * static_cast<uint64_t>(width);
  const int offset = static_cast<int>(position % 32);
  uint32_t code = codes[position / 32] >> offset;
  if (offset + width > 32) code |= codes[position / 32 + 1] << (32 - offset);
  code &= (1u << width) - 1u;
  const uint32_t sign_bit = 1u << (width - 1);
  const uint32_t level = code & (sign_bit - 1u);
  if (level > levels) return false;
  const float unit = scale * norms[i / bucket] / static_cast<float>(levels);
  const float magnitude = unit * static_cast<float>(level);
  term = (code & sign_bit) ? -magnitude : magnitude;
  return true;
}

// STC's mean magnitude μ sums |u| of the k chosen entries in double, in kStcMeanLanes
// lanes (entry j into lane j % kStcMeanLanes, each lane in entry order), then the lanes
// in lane order: a fixed order that a GPU block of kStcMeanLanes threads follows too,
// so CPU and GPU write the same μ.
constexpr int kStcMeanLanes = 1024;

}  // namespace gradzip::math
