// identity (fp32), fp16 and bf16: every element sent, in 32 or 16 bits.
// Body: n values, 4 or 2 bytes each, little-endian.
#pragma once

#include "codec/codec_record.h"
#include "codec/wire.h"

namespace gradzip {

// The values of an identity, fp16 or bf16 payload of n elements (4 or 2 bytes each),
// after checking its header; throws unless they are all the payload holds.
wire::Section read_cast_layout(wire::Reader& r, CodecId id, int64_t n);

extern const DeviceHalf kIdentityDevice;  // cuda/cast.cu
extern const DeviceHalf kFp16Device;
extern const DeviceHalf kBf16Device;

const CodecRecord& identity_record();
const CodecRecord& fp16_record();
const CodecRecord& bf16_record();

}  // namespace gradzip
