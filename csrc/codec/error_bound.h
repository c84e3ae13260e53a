// Error bounds shared by the error-bounded codecs (sz, zfp): the spec keys, and the
// absolute bound a tensor gets. ABS: |x̂ − x| ≤ bound for every element; REL:
// |x̂ − x| ≤ bound × (max − min) of the tensor (0 for a constant tensor: exact).
#pragma once

#include <cstdint>
#include <vector>

#include "codec/codec_record.h"

namespace gradzip {

// The keys mode=abs|rel and bound, as every error-bounded codec spells them.
std::vector<SpecKey> error_bound_keys();
// Sets p.relative_bound and p.bound from a spec whose keys were checked.
void parse_error_bound(const Spec& spec, CodecParameters& p);
// The absolute bound for u[0..n) under p. Throws std::invalid_argument when u holds Inf
// or NaN (an error bound means nothing for them).
double absolute_bound(const CodecParameters& p, const float* u, int64_t n, const char* codec);
// |x̂ − x| ≤ eb, compared exactly (in double, where both floats are exact).
inline bool within_bound(float reconstructed, float x, double eb) {
  const double d = static_cast<double>(reconstructed) - static_cast<double>(x);
  return d <= eb && -d <= eb;  // false for a non-finite reconstruction
}

}  // namespace gradzip
