// Error bounds shared by the error-bounded codecs (sz, zfp): the spec keys, and the
// absolute bound a tensor gets. ABS: |x̂ − x| ≤ bound for every element; REL:
// |x̂ − x| ≤ bound × (max − min) of the tensor (0 for a constant tensor: exact).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "codec/codec_record.h"

namespace gradzip {

// The keys mode=abs|rel and bound, as every error-bounded codec spells them.
std::vector<SpecKey> error_bound_keys();
// Whether a codec takes an error bound (its keys are error_bound_keys()).
bool takes_error_bound(const CodecRecord& record);
struct ErrorBoundParameters {
  bool relative = true;  // mode=rel: bound × (max − min); mode=abs: bound
  double bound = 0.0;
};
// mode and bound from a spec whose keys were checked.
ErrorBoundParameters parse_error_bound(const Spec& spec);
// `spec` (an error-bounded codec's) with mode=abs and the given bound, its other keys kept.
Spec with_absolute_bound(Spec spec, double bound);
// The absolute bound for u[0..n) under p. Throws std::invalid_argument when u holds Inf
// or NaN (an error bound means nothing for them).
double absolute_bound(const ErrorBoundParameters& p, const float* u, int64_t n, const char* codec);
// |x̂ − x| ≤ eb, decided exactly. The difference of two floats in double is exact unless
// their exponents lie far apart; then it may round onto eb itself, and the rounding error
// (TwoSum's remainder) tells which side the exact difference lies on.
inline bool within_bound(float reconstructed, float x, double eb) {
  const double a = reconstructed, c = -static_cast<double>(x);
  const double d = a + c;
  if (!(std::fabs(d) <= eb)) return false;  // NaN included
  if (std::fabs(d) < eb) return true;       // the remainder is below half an ulp of d
  const double cv = d - a;
  const double remainder = (a - (d - cv)) + (c - cv);
  return d > 0 ? remainder <= 0.0 : remainder >= 0.0;
}

}  // namespace gradzip
