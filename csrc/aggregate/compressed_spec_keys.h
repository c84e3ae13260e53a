// The spec keys of compressed aggregations, internal to csrc/aggregate: `layers` resolved
// once, for the checks of compressed_spec_keys.cpp and CompressedAllreduce's constructor.
#pragma once

#include <string>

#include "gradzip/bound_spec.h"

namespace gradzip {

// The spec's `layers`, auto resolved: adapt for the codecs with levels (top-k, random-k,
// STC, QSGD), on for those that ask for it (sign: its block scales within each
// parameter), off for the rest (the casts, whose small pieces would go as fp32; the
// error-bounded codecs, uniform, polar).
std::string layers_of(const BoundSpec& spec);

}  // namespace gradzip
