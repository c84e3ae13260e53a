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
  uint64_t bytes;  // the whole payload's
};
// The bytes per index the writers use for n elements: 4 up to 2^32, else 8.
uint8_t topk_index_width(int64_t n);
// The layouts of a topk payload of k entries, what the CPU and CUDA writers lay out and
// the reader checks: fp32 values with `width`-byte indices; compact: 2-byte values of
// `type` (fp16, bf16) with positions coded so.
TopKLayout topk_layout(uint64_t k, uint8_t width);
TopKLayout compact_topk_layout(uint64_t k, ValueType type, const PositionCoding& positions);
// The header and fixed fields of a payload of n elements laid out so (compact: the
// position header included); both writers.
void write_topk_fields(wire::Writer& w, int64_t n, const TopKLayout& layout);
// The one parser of a topk payload's layout (CPU decoder and CUDA dispatch). Throws PayloadError.
TopKLayout read_topk_layout(wire::Reader& r, int64_t n);

const CodecRecord& topk_record();
extern const DeviceHalf kTopKDevice;  // cuda/topk.cu

}  // namespace gradzip
