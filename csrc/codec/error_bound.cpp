#include "codec/error_bound.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "codec/cpu_features.h"

namespace gradzip {

namespace {

// Function-local, so that a codec record built during another file's static
// initialization finds them made.
const SpecKey& mode_key() {
  static const SpecKey key = SpecKey::choice(
      "mode", "rel", {"abs", "rel"}, "abs: |x̂ − x| ≤ bound; rel: |x̂ − x| ≤ bound × (max − min) of the tensor");
  return key;
}

const SpecKey& bound_key() {
  static const SpecKey key = SpecKey::number("bound", "1e-3", 0.0, 1e30, "the error bound (> 0)");
  return key;
}

struct Range {
  float low, high;
  bool non_finite;
};

// One pass: the range, and whether any exponent field is all ones (Inf or NaN); compares
// and integer ORs that vectorize.
[[gnu::always_inline]] inline Range range_of(const float* u, int64_t n) {
  float low = INFINITY, high = -INFINITY;
  uint32_t non_finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    low = u[i] < low ? u[i] : low;
    high = u[i] > high ? u[i] : high;
    uint32_t bits;
    std::memcpy(&bits, u + i, 4);
    non_finite |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
  }
  return {low, high, non_finite != 0};
}

Range range_baseline(const float* u, int64_t n) { return range_of(u, n); }

// The same loop compiled for AVX2 (eight lanes where the baseline build has four).
__attribute__((target("avx2"))) Range range_avx2(const float* u, int64_t n) { return range_of(u, n); }

bool has_key(const CodecRecord& record, const std::string& name) {
  for (const auto& key : record.keys) {
    if (key.name == name) return true;
  }
  return false;
}

}  // namespace

std::vector<SpecKey> error_bound_keys() { return {mode_key(), bound_key()}; }

bool takes_error_bound(const CodecRecord& record) {
  return has_key(record, mode_key().name) && has_key(record, bound_key().name);
}

ErrorBoundParameters parse_error_bound(const Spec& spec) {
  const ErrorBoundParameters p{.relative = spec.get_string(mode_key().name, mode_key().default_value) == "rel",
                               .bound = spec.get_double(bound_key().name, std::stod(bound_key().default_value))};
  if (!(p.bound > 0.0) || !std::isfinite(p.bound)) {
    throw SpecError("gradzip: spec '" + spec.str() + "': bound must be a finite number above 0");
  }
  return p;
}

Spec with_absolute_bound(Spec spec, double bound) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", bound);
  spec.params[mode_key().name] = "abs";
  spec.params[bound_key().name] = text;
  return spec;
}

double absolute_bound(const ErrorBoundParameters& p, const float* u, int64_t n, const char* codec) {
  const Range range = kHasAvx2 ? range_avx2(u, n) : range_baseline(u, n);
  if (range.non_finite) {
    throw std::invalid_argument(std::string("gradzip: ") + codec +
                                ": the tensor holds Inf or NaN, which no error bound can cover");
  }
  if (!p.relative) return p.bound;
  if (n == 0) return 0.0;
  return p.bound * (static_cast<double>(range.high) - static_cast<double>(range.low));
}

}  // namespace gradzip
