// sz: an error-bounded quantizer in the style of SZ (Di and Cappello, 2016), our own
// format, not SZ's. Each value is predicted (by 0, or by the previous reconstructed value:
// 1-D Lorenzo; predictor=auto takes the one with the smaller total prediction error),
// the prediction error is quantized in steps of 2·eb, and the integer codes are
// Golomb-Rice coded with a parameter per block of 4096. A value whose reconstruction
// would leave the bound (or whose code exceeds ±2^16) is sent exactly. Every decoded
// element is within eb of its input (error_bound.h); when coding would not beat 4 bytes
// per element the payload carries the floats instead.
//
// Body: u8 format (0 coded, 1 raw floats).
//   raw:   n fp32.
//   coded: u8 predictor (1 zero, 2 lorenzo), f64 eb, u64 exact-value count E,
//          u64 code bytes C, ceil(n/4096) u8 Rice parameters, C bytes of codes, E fp32.
//   A code s: 0 = the next exact value; s ≥ 1 = the zigzag of the quantized error, + 1.
//   With Rice parameter k: (s >> k) < 32 one-bits, a zero-bit, then the low k bits;
//   otherwise 32 one-bits, a zero-bit, then s in 18 bits.
#pragma once

#include "codec/codec_record.h"
#include "codec/wire.h"

namespace gradzip {

const CodecRecord& sz_record();

}  // namespace gradzip
