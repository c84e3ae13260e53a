// topk: the k = ceil(density·n) entries of largest magnitude, as (index, value) pairs.
// Body: u64 k, u8 index width (4 or 8 bytes), k ascending indices, k fp32 values.
#pragma once

#include "codec/codec_record.h"
#include "codec/wire.h"

namespace gradzip {

struct TopKLayout {
  uint64_t k;
  uint8_t width;
  wire::Section indices, values;
};
// The one parser of a topk payload's layout (CPU decoder and CUDA dispatch). Throws PayloadError.
TopKLayout read_topk_layout(wire::Reader& r, int64_t n);

const CodecRecord& topk_record();
extern const DeviceHalf kTopKDevice;  // cuda/topk_encode.cu

}  // namespace gradzip
