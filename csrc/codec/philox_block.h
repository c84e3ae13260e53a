// Philox4x32-10 for sixteen consecutive groups of four elements at once: the words for
// elements first .. first + 63, where the group starting at element e is counted by
// (e, step, rank). The same words as math::philox4x32_10 one group at a time (AVX-512
// or AVX2 when the CPU has them, chosen at run time; scalar otherwise).
#pragma once

#include <cstdint>

namespace gradzip {

constexpr int kPhiloxWords = 64;

void philox_words(uint64_t first, uint32_t step, uint32_t rank, uint64_t seed, uint32_t words[kPhiloxWords]);

}  // namespace gradzip
