// randomk: k = ceil(density·n) entries chosen by (seed, step), the same on every rank,
// so only their values travel; with unbiased=1 they are scaled by n/k.
// Body: u64 k, u64 seed, u64 step, f32 value scale, k fp32 values (ascending index order).
#pragma once

#include "codec/codec_record.h"

namespace gradzip {

const CodecRecord& randomk_record();

}  // namespace gradzip
