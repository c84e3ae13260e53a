// polar: the signs of u in blocks of N = 2^m elements, compressed at rate R by polar
// lossy source coding (polar_code.h: successive-cancellation encoding, Korada and
// Urbanke 2010), with one scale per block. A block sends round(R·N) free bits instead of N
// sign bits; its decoded signs differ from u's in about a fraction D of places (R = 0.5:
// D ≈ 0.115 at N = 4096 against the bound 0.110), and its scale is the one that minimizes
// the block's squared error given those signs: Σ|u_i|·(agree ? 1 : −1) / N. Error feedback
// (on by default) carries what the flipped signs lost. A tensor's last partial block of t
// elements is coded with the smallest 2^m' ≥ t (its sources padded with zeros) and
// ceil(K·2^m'/N) free bits.
//
// Body: u32 block N, u32 free bits K per full block, ⌈n/N⌉ × f32 scales, then the free
// bits of every block in order (bit 1 of a decoded sign = non-negative), zero-padded to a
// byte. The frozen sets are not sent: both sides derive them from (m, K).
#pragma once

#include "codec/codec_record.h"

namespace gradzip {

const CodecRecord& polar_record();

}  // namespace gradzip
