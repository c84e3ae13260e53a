// identity (fp32), fp16 and bf16: every element sent, in 32 or 16 bits.
// Body: n values, 4 or 2 bytes each, little-endian.
#pragma once

#include "codec/codec_record.h"

namespace gradzip {

const CodecRecord& identity_record();
const CodecRecord& fp16_record();
const CodecRecord& bf16_record();

}  // namespace gradzip
