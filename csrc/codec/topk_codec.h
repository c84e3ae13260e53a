// topk: the k = ceil(density·n) entries of largest magnitude, as (position, value) pairs.
// Body, values=fp32: u64 k, u8 index width (4 or 8 bytes), k ascending indices, k fp32
// values. Compact, values=fp16|bf16: u64 k, u8 0 (no index width: coded positions), u8
// value type (1 fp16, 2 bf16), the positions (codec/position_coding.h), k 2-byte values.
#pragma once

#include "codec/codec_record.h"
#include "codec/position_coding.h"
#include "codec/selection_codec.h"
#include "codec/wire.h"

namespace gradzip {

struct TopKParameters {
  SelectionParameters selection;
  ValueType values = ValueType::kFp32;  // how values travel (fp16, bf16: positions coded too)
};
// The parameters of a topk codec (std::logic_error for another codec).
const TopKParameters& topk_parameters(const Codec& codec);

struct TopKLayout {
  uint64_t k;
  ValueType value_type;
  uint8_t width;               // fp32: bytes per index
  wire::Section indices;       // fp32: the indices
  PositionLayout positions{};  // compact: the coded positions
  wire::Section values;
};
// The one parser of a topk payload's layout (CPU decoder and CUDA dispatch). Throws PayloadError.
TopKLayout read_topk_layout(wire::Reader& r, int64_t n);

const CodecRecord& topk_record();
extern const DeviceHalf kTopKDevice;  // cuda/topk_encode.cu

}  // namespace gradzip
