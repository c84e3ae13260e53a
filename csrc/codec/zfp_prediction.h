// What ZFP's decoder returns for a 1-D float field compressed in fixed-accuracy mode,
// computed from the field alone, without writing or reading a stream. ZFP's lossy path
// (Lindstrom, "Fixed-Rate Compressed Floating-Point Arrays", 2014) is deterministic block
// by block: each block of four values gets its largest exponent, a cast to 30-bit
// integers, a decorrelating lifting transform and a negabinary map; fixed-accuracy mode
// keeps whole bit planes down to the one the tolerance sets; the decoder inverts each
// step. Predicting that costs a few vector operations per value, a tenth of ZFP's
// compress, where a decode costs about as much as the compress: the zfp codec finds the
// values ZFP leaves outside the bound at that cost.
//
// The prediction is exact only for a library that implements the algorithm as libzfp 1.0
// does with its default rounding (ZFP_ROUND_NEVER). zfp_prediction_matches_library()
// checks it bit for bit against the linked library's own decoder once per process; the
// codec decodes the stream instead when it does not match.
#pragma once

#include <cstdint>
#include <vector>

namespace gradzip {

// Writes to out[0..n) what zfp_decompress gives for values[0..n) (finite) compressed by
// zfp_compress as a 1-D float field under zfp_stream_set_accuracy(tolerance), tolerance
// above 0. Returns false, out unspecified, when a block lies outside what the prediction
// covers: a block with bit planes to keep whose largest magnitude is below 2^-90 (there
// ZFP's power-of-two scale overflows a float; see llnl/zfp issues 119 and 209).
bool predict_zfp_accuracy_decode(const float* values, int64_t n, double tolerance, float* out);

// Appends to `outside`, ascending, the index of every value whose decode under
// zfp_stream_set_accuracy(bound) (as predicted above) leaves |x̂ − x| ≤ bound, decided
// exactly (error_bound.h's within_bound). One pass, no decoded copy of the field. Returns
// false, `outside` unspecified, where predict_zfp_accuracy_decode would.
bool zfp_values_outside_bound(const float* values, int64_t n, double bound, std::vector<uint64_t>& outside);

// Whether predict_zfp_accuracy_decode agrees bit for bit with the linked libzfp's decoder
// on a fixed set of awkward fields (every span of exponents against the tolerance, signs,
// zeros, subnormals, partial blocks). Computed once per process; a few milliseconds.
bool zfp_prediction_matches_library();

}  // namespace gradzip
