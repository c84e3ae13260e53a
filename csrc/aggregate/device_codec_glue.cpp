#include "aggregate/device_codec_glue.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
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
                          at::Tensor& sum, float scale, bool set, const uint8_t* prefixes, size_t prefix_stride) {
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
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(sum.device().index());
  cuda::device_decode_add(codec, gathered.data_ptr<uint8_t>(), static_cast<size_t>(stride), sizes,
                          sum.data_ptr<float>(), sum.numel(), arena, stream, scale, set, prefixes, prefix_stride);
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
    slot.narrow(0, 0, kSlotHeaderBytes).view(at::kLong).fill_(size);  // a fill kernel: no host copy
    slot.narrow(0, kSlotHeaderBytes, size).copy_(payload);
    slot.narrow(0, kSlotHeaderBytes + size, slot.numel() - kSlotHeaderBytes - size).zero_();
  }

  void decode_sum(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    TORCH_CHECK(slots.is_cuda() && slots.scalar_type() == at::kByte && slots.is_contiguous() &&
                    slots.numel() >= rows * stride && stride > kSlotHeaderBytes,
                "gradzip: the slots must be ", rows, " contiguous uint8 rows of ", stride, " bytes on a GPU");
    // Each slot's length and its payload's fixed fields: one copy, one synchronization.
    const c10::cuda::CUDAGuard guard(slots.device());
    const auto head = static_cast<size_t>(
        kSlotHeaderBytes + std::min<int64_t>(static_cast<int64_t>(cuda::payload_prefix_bytes(stride)),
                                             stride - kSlotHeaderBytes));
    const std::vector<uint8_t> heads =
        cuda::read_row_prefixes(slots.data_ptr<uint8_t>(), static_cast<size_t>(stride), rows, head,
                                c10::cuda::getCurrentCUDAStream(slots.device().index()));
    std::vector<size_t> sizes(rows);
    for (int r = 0; r < rows; ++r) {
      uint64_t size;
      std::memcpy(&size, heads.data() + r * head, 8);
      sizes[r] = slot_payload_size(size, stride, r);
    }
    const at::Tensor payloads = slots.narrow(0, kSlotHeaderBytes, rows * stride - kSlotHeaderBytes);
    try {
      decode_add_on_device(codec_->id(), payloads, stride, sizes, sum, scale, /*set=*/true,
                           heads.data() + kSlotHeaderBytes, head);
    } catch (const cuda::RankPayloadError& e) {
      throw SlotError(e.rank(), e.what());
    }
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
