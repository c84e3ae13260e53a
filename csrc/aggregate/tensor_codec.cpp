#include "aggregate/tensor_codec.h"

#include <c10/util/Exception.h>

#include <cstring>

#ifdef GRADZIP_WITH_CUDA
#include "aggregate/device_codec_glue.h"
#endif

namespace gradzip {
namespace {

// The codec's CPU code on CPU tensors.
class HostTensorCodec final : public TensorCodec {
 public:
  explicit HostTensorCodec(std::shared_ptr<const Codec> codec) : codec_(std::move(codec)) {}

  int64_t slot_bytes(int64_t n) const override { return gradzip::slot_bytes(*codec_, n); }
  std::unique_ptr<TensorCodec> part(int64_t, int64_t) const override {
    return std::make_unique<HostTensorCodec>(codec_);
  }

  void encode(const at::Tensor& x, const at::Tensor& residual, const EncodeContext& ctx,
              at::Tensor slot) const override {
    uint8_t* at = slot.data_ptr<uint8_t>();
    const size_t size =
        codec_->encode_into(x.data_ptr<float>(), x.numel(), residual.defined() ? residual.data_ptr<float>() : nullptr,
                            ctx, at + kSlotHeaderBytes, static_cast<size_t>(slot.numel() - kSlotHeaderBytes));
    seal_slot(size, at, slot.numel());
  }

  void decode_sum(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    sum.zero_();
    const uint8_t* base = slots.data_ptr<uint8_t>();
    for (int r = 0; r < rows; ++r) {
      const uint8_t* slot = base + r * stride;
      uint64_t declared;
      std::memcpy(&declared, slot, 8);
      const size_t size = slot_payload_size(declared, stride, r);
      try {
        codec_->decode_add(slot + kSlotHeaderBytes, size, sum.data_ptr<float>(), sum.numel(), scale);
      } catch (const PayloadError& e) {
        throw SlotError(r, e.what());
      }
    }
  }

  void decode_each(const at::Tensor& slots, int64_t stride, const std::vector<at::Tensor>& targets,
                   float scale) const override {
    for (size_t r = 0; r < targets.size(); ++r) {
      try {
        decode_sum(slots.narrow(0, static_cast<int64_t>(r) * stride, stride), stride, 1, targets[r], scale);
      } catch (const SlotError& e) {
        throw SlotError(static_cast<int>(r), e.what());
      }
    }
  }

 private:
  std::shared_ptr<const Codec> codec_;
};

}  // namespace

std::unique_ptr<TensorCodec> tensor_codec(const std::shared_ptr<const Codec>& codec, const at::Device& device) {
#ifdef GRADZIP_WITH_CUDA
  if (device.is_cuda()) return device_tensor_codec(codec);
#endif
  TORCH_CHECK(device.is_cpu(), "gradzip: the ", codec->name(), " codec has no encoder for tensors on ", device);
  return std::make_unique<HostTensorCodec>(codec);
}

}  // namespace gradzip
