// zfp: ZFP's fixed-accuracy mode (Lindstrom, 2014; Debian's libzfp) on the flattened
// tensor, with a guarantee ZFP alone does not give (it leaves values outside its tolerance
// in rare blocks, llnl/zfp#62): the encoder learns what the receiver will decode, by
// predicting it (zfp_prediction.h: exact, and a fraction of a decode's cost) or, where the
// prediction does not reach, by decoding its own stream, and sends every element that left
// the bound exactly (a correction), so every decoded element is within eb of its input
// (error_bound.h). An eb of 0 (rel on a constant
// tensor) uses ZFP's reversible, lossless mode. When the stream and its corrections would
// not beat 4 bytes per element the payload carries the floats instead.
//
// Body: u8 format (0 zfp, 1 raw floats).
//   raw: n fp32.
//   zfp: u8 zfp mode (0 fixed accuracy, 1 reversible), f64 tolerance, u64 stream bytes S,
//        u64 correction count K, S bytes of ZFP stream, K × (u64 index,
//        fp32 value) with indices ascending and below n.
// Decoding reads the stream from a zero-padded copy of ZFP's most bytes for n elements,
// so a corrupt stream cannot make ZFP read outside memory it owns.
#pragma once

#include "codec/codec_record.h"

namespace gradzip {

const CodecRecord& zfp_record();

}  // namespace gradzip
