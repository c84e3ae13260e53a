#include "aggregate/device_codec_glue.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstring>

#include "device_codec.h"

namespace gradzip {
namespace {

// Device memory from torch's caching allocator, held until the arena goes: the
// allocator orders any reuse after the work already queued on the stream.
class TorchArena final : public DeviceArena {
 public:
  explicit TorchArena(at::Device device) : device_(device) {}
  void* allocate(size_t bytes) override {
    held_.push_back(at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, at::dtype(at::kByte).device(device_)));
    return held_.back().data_ptr();
  }
  // The tensor that owns `data` (an allocation of this arena).
  at::Tensor owner(const void* data) const {
    for (const auto& t : held_) {
      if (t.data_ptr() == data) return t;
    }
    TORCH_INTERNAL_ASSERT(false, "gradzip: memory not from this arena");
  }

 private:
  at::Device device_;
  std::vector<at::Tensor> held_;
};

void check_on_device(const at::Tensor& t, const at::Device& device, const char* what) {
  TORCH_CHECK(t.device() == device && t.scalar_type() == at::kFloat && t.is_contiguous(), "gradzip: ", what,
              " must be a contiguous float32 tensor on ", device, ", got ", t.scalar_type(), " on ", t.device());
}

}  // namespace

at::Tensor encode_on_device(const Codec& codec, const at::Tensor& x, const at::Tensor& residual,
                            const EncodeContext& ctx) {
  TORCH_CHECK(x.is_cuda(), "gradzip: the GPU encoder takes a CUDA tensor, got one on ", x.device());
  check_on_device(x, x.device(), "the input");
  if (residual.defined()) {
    check_on_device(residual, x.device(), "the residual");
    TORCH_CHECK(residual.numel() == x.numel(), "gradzip: the residual has ", residual.numel(),
                " elements, the input ", x.numel());
  }
  const c10::cuda::CUDAGuard guard(x.device());
  TorchArena arena(x.device());
  const auto payload =
      cuda::device_encode(codec, x.data_ptr<float>(), x.numel(), residual.defined() ? residual.data_ptr<float>() : nullptr,
                          ctx, arena, c10::cuda::getCurrentCUDAStream(x.device().index()));
  return arena.owner(payload.data).narrow(0, 0, static_cast<int64_t>(payload.size));
}

void decode_add_on_device(CodecId codec, const at::Tensor& gathered, int64_t stride, const std::vector<size_t>& sizes,
                          at::Tensor& sum) {
  TORCH_CHECK(sum.is_cuda(), "gradzip: the GPU decoder writes a CUDA tensor, got one on ", sum.device());
  check_on_device(sum, sum.device(), "the sum");
  TORCH_CHECK(gathered.device() == sum.device() && gathered.scalar_type() == at::kByte && gathered.is_contiguous(),
              "gradzip: the payloads must be a contiguous uint8 tensor on ", sum.device());
  TORCH_CHECK(stride % 8 == 0, "gradzip: payload rows must be a multiple of 8 bytes apart, got ", stride);
  // The sign and QSGD decoders load 32-bit words, the headers 64-bit ones.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(gathered.data_ptr()) % 8 == 0,
              "gradzip: the payload buffer must start on an 8-byte boundary");
  for (size_t r = 0; r < sizes.size(); ++r) {
    TORCH_CHECK(sizes[r] <= static_cast<size_t>(stride) &&
                    static_cast<int64_t>(r) * stride + static_cast<int64_t>(sizes[r]) <= gathered.numel(),
                "gradzip: the payload of row ", r, " does not fit in the payload buffer");
  }
  const c10::cuda::CUDAGuard guard(sum.device());
  TorchArena arena(sum.device());
  cuda::device_decode_add(codec, gathered.data_ptr<uint8_t>(), static_cast<size_t>(stride), sizes,
                          sum.data_ptr<float>(), sum.numel(), arena, c10::cuda::getCurrentCUDAStream(sum.device().index()));
}

namespace {

class DeviceTensorCodec final : public TensorCodec {
 public:
  explicit DeviceTensorCodec(std::shared_ptr<const Codec> codec) : codec_(std::move(codec)) {}

  void encode(const at::Tensor& x, const at::Tensor& residual, const EncodeContext& ctx,
              at::Tensor slot) const override {
    const at::Tensor payload = encode_on_device(*codec_, x, residual, ctx);
    const int64_t size = payload.numel();
    check_slot_fits(size, slot.numel());
    slot.narrow(0, 0, kSlotHeaderBytes).copy_(at::full({1}, size, at::kLong).view(at::kByte));
    slot.narrow(0, kSlotHeaderBytes, size).copy_(payload);
    slot.narrow(0, kSlotHeaderBytes + size, slot.numel() - kSlotHeaderBytes - size).zero_();
  }

  void decode_add(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    const at::Tensor declared =
        slots.narrow(0, 0, rows * stride).view({rows, stride}).narrow(1, 0, kSlotHeaderBytes).contiguous().cpu();
    std::vector<size_t> sizes(rows);
    for (int r = 0; r < rows; ++r) {
      uint64_t size;
      std::memcpy(&size, declared.data_ptr<uint8_t>() + r * kSlotHeaderBytes, 8);
      sizes[r] = slot_payload_size(size, stride, r);
    }
    const at::Tensor payloads = slots.narrow(0, kSlotHeaderBytes, rows * stride - kSlotHeaderBytes);
    // The kernels add unscaled values: with a scale, into zeros first.
    at::Tensor target = scale == 1.0f ? sum : at::zeros_like(sum);
    try {
      decode_add_on_device(codec_->id(), payloads, stride, sizes, target);
    } catch (const cuda::RankPayloadError& e) {
      throw SlotError(e.rank(), e.what());
    }
    if (scale != 1.0f) sum.add_(target, scale);
  }

 private:
  std::shared_ptr<const Codec> codec_;
};

}  // namespace

std::unique_ptr<TensorCodec> device_tensor_codec(std::shared_ptr<const Codec> codec) {
  TORCH_CHECK(cuda::has_device_half(*codec), "gradzip: the ", codec->name(), " codec has no GPU encoder");
  return std::make_unique<DeviceTensorCodec>(std::move(codec));
}

}  // namespace gradzip
