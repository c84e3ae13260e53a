#include "codec/philox_block.h"

// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined
// placeholders (a known false positive); this file holds only the Philox blocks.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "codec/cpu_features.h"
#include "codec/element_math.cuh"

namespace gradzip {
namespace {

void philox_words32_scalar(uint64_t first, uint32_t step, uint32_t rank, uint64_t seed, uint32_t words[32]) {
  for (int lane = 0; lane < 8; ++lane) {
    const uint64_t counter = first + 4 * static_cast<uint64_t>(lane);
    const auto r = math::philox4x32_10(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), step,
                                       rank, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    for (int w = 0; w < 4; ++w) words[4 * lane + w] = r.v[w];
  }
}

// hi and lo 32 bits of m × a in each of eight 32-bit lanes.
__attribute__((target("avx2"))) inline void mulhilo8(__m256i m, __m256i a, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);                         // lanes 0, 2, 4, 6 as 64-bit
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1, 3, 5, 7
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

__attribute__((target("avx2"))) void philox_words32_avx2(uint64_t first, uint32_t step, uint32_t rank,
                                                         uint64_t seed, uint32_t words[32]) {
  alignas(32) uint32_t lo_counters[8];
  alignas(32) uint32_t hi_counters[8];
  for (int lane = 0; lane < 8; ++lane) {
    const uint64_t counter = first + 4 * static_cast<uint64_t>(lane);
    lo_counters[lane] = static_cast<uint32_t>(counter);
    hi_counters[lane] = static_cast<uint32_t>(counter >> 32);
  }
  __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_counters));
  __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_counters));
  __m256i c2 = _mm256_set1_epi32(static_cast<int>(step));
  __m256i c3 = _mm256_set1_epi32(static_cast<int>(rank));
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mulhilo8(m0, c0, hi0, lo0);
    mulhilo8(m1, c2, hi1, lo1);
    const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0)), key1 = _mm256_set1_epi32(static_cast<int>(k1));
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), key0);
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), key1);
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  alignas(32) uint32_t out[4][8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out[0]), c0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(out[1]), c1);
  _mm256_store_si256(reinterpret_cast<__m256i*>(out[2]), c2);
  _mm256_store_si256(reinterpret_cast<__m256i*>(out[3]), c3);
  for (int lane = 0; lane < 8; ++lane) {
    for (int w = 0; w < 4; ++w) words[4 * lane + w] = out[w][lane];
  }
}

__attribute__((target("avx512f"))) inline void mulhilo16(__m512i m, __m512i a, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

__attribute__((target("avx512f"))) void philox_words64_avx512(uint64_t first, uint32_t step, uint32_t rank,
                                                             uint64_t seed, uint32_t words[64]) {
  alignas(64) uint32_t lo_counters[16];
  alignas(64) uint32_t hi_counters[16];
  for (int lane = 0; lane < 16; ++lane) {
    const uint64_t counter = first + 4 * static_cast<uint64_t>(lane);
    lo_counters[lane] = static_cast<uint32_t>(counter);
    hi_counters[lane] = static_cast<uint32_t>(counter >> 32);
  }
  __m512i c0 = _mm512_load_si512(lo_counters);
  __m512i c1 = _mm512_load_si512(hi_counters);
  __m512i c2 = _mm512_set1_epi32(static_cast<int>(step));
  __m512i c3 = _mm512_set1_epi32(static_cast<int>(rank));
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int round = 0; round < 10; ++round) {
    __m512i hi0, lo0, hi1, lo1;
    mulhilo16(m0, c0, hi0, lo0);
    mulhilo16(m1, c2, hi1, lo1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  alignas(64) uint32_t out[4][16];
  _mm512_store_si512(out[0], c0);
  _mm512_store_si512(out[1], c1);
  _mm512_store_si512(out[2], c2);
  _mm512_store_si512(out[3], c3);
  for (int lane = 0; lane < 16; ++lane) {
    for (int w = 0; w < 4; ++w) words[4 * lane + w] = out[w][lane];
  }
}

}  // namespace

void philox_words(uint64_t first, uint32_t step, uint32_t rank, uint64_t seed, uint32_t words[kPhiloxWords]) {
  if (kHasAvx512) return philox_words64_avx512(first, step, rank, seed, words);
  for (int half = 0; half < 2; ++half) {
    const uint64_t start = first + 32 * static_cast<uint64_t>(half);
    kHasAvx2 ? philox_words32_avx2(start, step, rank, seed, words + 32 * half)
             : philox_words32_scalar(start, step, rank, seed, words + 32 * half);
  }
}

}  // namespace gradzip
