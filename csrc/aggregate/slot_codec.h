// SlotCodec: a codec on the tensors of one device, writing and reading slots
// (aggregate/slots.h): the codec's CPU code, or its device half on a GPU.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "aggregate/slots.h"
#include "gradzip/codec.h"

namespace gradzip {

// A codec on the tensors of one device.
class SlotCodec {
 public:
  virtual ~SlotCodec() = default;
  // The bytes of a slot that holds any payload of this codec for an n-element tensor.
  virtual int64_t slot_bytes(int64_t n) const = 0;
  // The codec of elements [begin, begin + length) of the tensor (a shard or a chunk of
  // it): the same codec for codecs that do not depend on the element's position.
  virtual std::unique_ptr<SlotCodec> part(int64_t begin, int64_t length) const = 0;
  // Whether part() is this codec wherever the part lies (false for a piecewise codec,
  // whose parts hold the pieces they cut): exchanges then use this codec for every chunk.
  virtual bool uniform() const { return true; }
  // Encodes x (contiguous float32) into `slot` (uint8, at least slot_bytes(x.numel());
  // what follows the payload is zeroed);
  // with a defined `residual` (float32, x.numel(), same device) with error feedback.
  virtual void encode(const at::Tensor& x, const at::Tensor& residual, const EncodeContext& ctx,
                      at::Tensor slot) const = 0;
  // Sets `sum` (contiguous float32) to scale × the payloads of `rows` slots, slot r at
  // byte r·stride of `slots`, added to zeros in order r = 0, 1, ... as the codec's
  // decode_add(..., scale) adds them (a GPU codec without a one-pass decode may apply the
  // scale to the sum instead: the same bits on every rank of one device). Throws
  // SlotError naming the first slot that cannot be decoded (a failed slot included).
  virtual void decode_sum(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum,
                          float scale = 1.0f) const = 0;
  // As decode_sum, but adds to what `sum` holds (a running state: CHOCO's public copies)
  // instead of to zeros.
  virtual void decode_add(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum,
                          float scale = 1.0f) const = 0;
  // Sets targets[r] to scale × the payload of slot r alone, for r = 0 .. targets.size() − 1
  // (the owners' reduced pieces: each its own part of the result). Throws SlotError naming
  // the first slot that cannot be decoded.
  virtual void decode_each(const at::Tensor& slots, int64_t stride, const std::vector<at::Tensor>& targets,
                           float scale) const = 0;
};

// Where `codec` works on `tensor`, and keeps the state that goes with it (residuals,
// public copies): the tensor's GPU when the codec has a device half (CUDA builds), else
// the CPU.
at::Device codec_device(const Codec& codec, const at::Tensor& tensor);

// The SlotCodec for tensors on `device`: the codec's CPU code, or its device half on a
// GPU (CUDA builds; the codec must have one).
std::unique_ptr<SlotCodec> slot_codec(const std::shared_ptr<const Codec>& codec, const at::Device& device);

}  // namespace gradzip
