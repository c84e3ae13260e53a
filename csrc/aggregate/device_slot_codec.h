// The GPU codecs (cuda/device_codec.h) on at::Tensor: torch's caching allocator for
// their memory, the current CUDA stream for their work. Only in CUDA builds.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "aggregate/slot_codec.h"
#include "codec/codec_record.h"

namespace gradzip {

// Encodes x (a contiguous float32 CUDA tensor) on its device, as codec.encode() would
// on the CPU (the codec must have a device half); `residual` (undefined: no error feedback) is a float32 tensor of
// x.numel() elements on the same device. Returns the payload: a uint8 CUDA tensor of
// exactly its size, whose storage is rounded up to 8 bytes.
at::Tensor encode_on_device(const Codec& codec, const at::Tensor& x, const at::Tensor& residual,
                            const EncodeContext& ctx);

// Adds scale × the payloads stored in `gathered` (uint8, CUDA) at offsets r·stride,
// sizes[r] bytes each, into `sum` (float32, contiguous, same device; with `set` into
// zeros, sum's values unread), in order r = 0, 1, ... (cuda::device_decode_add, which
// describes `prefixes`). Throws cuda::RankPayloadError naming the first invalid one.
void decode_add_on_device(CodecId codec, const at::Tensor& gathered, int64_t stride, const std::vector<size_t>& sizes,
                          at::Tensor& sum, float scale = 1.0f, bool set = false, const uint8_t* prefixes = nullptr,
                          size_t prefix_stride = 0);

// Tells torch's caching allocator that work queued on the current stream uses `t` (a
// CUDA tensor): when that is not the stream `t` was allocated on, freeing or replacing
// `t` later (a load, a new layout) then waits for that work before its memory is reused.
// A no-op on its own stream.
void record_on_current_stream(const at::Tensor& t);

// The SlotCodec (aggregate/exchange.h) of a codec with a device half, for CUDA
// tensors: encodes and decodes on the current stream. Decoding reads each slot's size
// and its payload's fixed fields on the host in one small copy.
std::unique_ptr<SlotCodec> device_slot_codec(std::shared_ptr<const Codec> codec);

}  // namespace gradzip
