#include "codec/bitpack.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "codec/cpu_features.h"
#include "codec/element_math.cuh"

namespace gradzip::bitpack {
namespace {

void pack_nonnegative_scalar(const float* x, int64_t n, uint8_t* out, int64_t from) {
  for (int64_t byte = from / 8; byte * 8 < n; ++byte) {
    uint32_t bits = 0;
    for (int j = 0; j < 8 && byte * 8 + j < n; ++j) bits |= math::nonnegative_bit(x[byte * 8 + j]) << j;
    out[byte] = static_cast<uint8_t>(bits);
  }
}

__attribute__((target("avx2"))) int64_t pack_nonnegative_avx2(const float* x, int64_t n, uint8_t* out) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // movemask collects the 8 sign bits of 8 floats; inverted, they are the >= 0 bits.
    const uint32_t b0 = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_loadu_ps(x + i)));
    const uint32_t b1 = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_loadu_ps(x + i + 8)));
    const uint32_t b2 = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_loadu_ps(x + i + 16)));
    const uint32_t b3 = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_loadu_ps(x + i + 24)));
    const uint32_t word = ~(b0 | (b1 << 8) | (b2 << 16) | (b3 << 24));
    std::memcpy(out + i / 8, &word, 4);
  }
  return i;
}

__attribute__((target("avx2"))) int64_t add_signs_avx2(const uint8_t* bits, int64_t n, float plus, float minus,
                                                       float* out) {
  const __m256i lanes = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 vplus = _mm256_set1_ps(plus), vminus = _mm256_set1_ps(minus);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i byte = _mm256_set1_epi32(bits[i / 8]);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(byte, lanes), lanes);
    const __m256 value = _mm256_blendv_ps(vminus, vplus, _mm256_castsi256_ps(set));
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), value));
  }
  return i;
}

}  // namespace

void pack_nonnegative(const float* x, int64_t n, uint8_t* out) {
  const int64_t done = kHasAvx2 ? pack_nonnegative_avx2(x, n, out) : 0;
  pack_nonnegative_scalar(x, n, out, done);
}

void add_signs(const uint8_t* bits, int64_t n, float plus, float minus, float* out) {
  int64_t i = kHasAvx2 ? add_signs_avx2(bits, n, plus, minus, out) : 0;
  for (; i < n; ++i) out[i] += ((bits[i / 8] >> (i % 8)) & 1) ? plus : minus;
}

namespace {

// Codes of eight elements take `kWidth` whole bytes: unpacks n / 8 such groups from one
// 64-bit (kWidth <= 8) or 128-bit load each, shifts by constants the compiler unrolls and
// vectorizes; a load never reaches past the group's bytes beyond `bytes`. Returns the
// groups unpacked; the caller unpacks the rest.
template <int kWidth>
int64_t unpack_groups(const uint8_t* in, int64_t n, uint64_t bytes, uint16_t* codes) {
  using Word = std::conditional_t<(kWidth <= 8), uint64_t, unsigned __int128>;
  constexpr uint64_t kMask = (uint64_t{1} << kWidth) - 1;
  const uint64_t loadable = bytes >= sizeof(Word) ? (bytes - sizeof(Word)) / kWidth + 1 : 0;
  const int64_t groups = std::min<int64_t>(n / 8, static_cast<int64_t>(loadable));
  for (int64_t g = 0; g < groups; ++g) {
    Word word;
    std::memcpy(&word, in + g * kWidth, sizeof(Word));
    for (int j = 0; j < 8; ++j) codes[8 * g + j] = static_cast<uint16_t>(static_cast<uint64_t>(word >> (j * kWidth)) & kMask);
  }
  return groups;
}

// Writes n / 8 groups of eight codes (their low kWidth bits), each group's kWidth bytes
// from one word: exactly those bytes, nothing past them.
template <int kWidth>
void pack_groups(const uint32_t* codes, int64_t groups, uint8_t* out) {
  using Word = std::conditional_t<(kWidth <= 8), uint64_t, unsigned __int128>;
  constexpr uint32_t kMask = (uint32_t{1} << kWidth) - 1;
  for (int64_t g = 0; g < groups; ++g) {
    Word word = 0;
    for (int j = 0; j < 8; ++j) word |= static_cast<Word>(codes[8 * g + j] & kMask) << (j * kWidth);
    std::memcpy(out + g * kWidth, &word, kWidth);
  }
}

// Calls f(std::integral_constant<int, width>) for a width of 1..16.
template <class F, int... kWidths>
void with_width(int width, F&& f, std::integer_sequence<int, kWidths...>) {
  ((width == kWidths + 1 ? (f(std::integral_constant<int, kWidths + 1>{}), true) : false) || ...);
}
template <class F>
void with_width(int width, F&& f) {
  with_width(width, std::forward<F>(f), std::make_integer_sequence<int, 16>{});
}

}  // namespace

void unpack_codes(const uint8_t* in, int64_t n, int width, uint16_t* codes) {
  const uint64_t bytes = (static_cast<uint64_t>(n) * static_cast<uint64_t>(width) + 7) / 8;
  int64_t groups = 0;
  with_width(width, [&](auto w) { groups = unpack_groups<w()>(in, n, bytes, codes); });
  // The last elements, bit by bit from the byte where the groups ended.
  const uint64_t mask = (uint64_t{1} << width) - 1;
  uint64_t buffer = 0;
  int filled = 0;
  const uint8_t* at = in + groups * width;
  for (int64_t i = 8 * groups; i < n; ++i) {
    while (filled < width) {
      buffer |= static_cast<uint64_t>(*at++) << filled;
      filled += 8;
    }
    codes[i] = static_cast<uint16_t>(buffer & mask);
    buffer >>= width;
    filled -= width;
  }
}

void pack_code_groups(const uint32_t* codes, int64_t n, int width, uint8_t* out) {
  with_width(width, [&](auto w) { pack_groups<w()>(codes, n / 8, out); });
}

void BitWriter::put(uint64_t value, int bits) {
  buffer_ |= (value & ((uint64_t{1} << bits) - 1)) << filled_;
  filled_ += bits;
  while (filled_ >= 8) {
    out_.push_back(static_cast<uint8_t>(buffer_));
    buffer_ >>= 8;
    filled_ -= 8;
  }
}

void BitWriter::put_ones(uint64_t count) {
  for (; count >= 32; count -= 32) put(0xffffffffu, 32);
  if (count) put((uint64_t{1} << count) - 1, static_cast<int>(count));
}

void BitWriter::flush() {
  if (filled_ > 0) out_.push_back(static_cast<uint8_t>(buffer_));
  buffer_ = 0;
  filled_ = 0;
}

uint64_t BitReader::window(int& valid) const {
  const uint64_t byte = position_ / 8;
  const uint64_t present = size_ > byte ? std::min<uint64_t>(8, size_ - byte) : 0;
  uint64_t word = 0;
  if (present > 0) std::memcpy(&word, data_ + byte, present);
  const int shift = static_cast<int>(position_ % 8);
  valid = static_cast<int>(std::min<uint64_t>(64 - shift, size_ * 8 - std::min(position_, size_ * 8)));
  return word >> shift;
}

uint64_t BitReader::get_near_end(int bits) {
  if (bits == 0) return 0;
  if (bits > 56) {
    const uint64_t low = get(32);
    return low | (get(bits - 32) << 32);
  }
  if (position_ + bits > size_ * 8) {  // as many zeros as bit-by-bit reading gives
    failed_ = true;
    uint64_t value = 0;
    for (int b = 0; b < bits && position_ < size_ * 8; ++b) value |= static_cast<uint64_t>(get_bit()) << b;
    return value;
  }
  int valid;
  const uint64_t value = window(valid) & ((uint64_t{1} << bits) - 1);
  position_ += bits;
  return value;
}

uint64_t BitReader::get_ones_near_end() {
  uint64_t ones = 0;
  while (true) {
    int valid;
    const uint64_t bits = window(valid);
    if (valid == 0) {
      failed_ = true;
      return ones;
    }
    const int run = bits == ~uint64_t{0} ? 64 : __builtin_ctzll(~bits);
    if (run < valid) {
      position_ += run + 1;
      return ones + run;
    }
    ones += valid;
    position_ += valid;
  }
}

bool BitReader::get_bit() {
  if (position_ >= size_ * 8) {
    failed_ = true;
    return false;
  }
  const bool bit = (data_[position_ / 8] >> (position_ % 8)) & 1;
  ++position_;
  return bit;
}

}  // namespace gradzip::bitpack
