#include "aggregate/device_slot_codec.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstring>

#include "cuda/device_codec.h"

namespace gradzip {
namespace {

// Device memory from torch's caching allocator, held until the arena goes: the
// allocator orders any reuse after the work already queued on the stream.
class TorchArena : public DeviceArena {
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

// A TorchArena that hands out the payload region of a slot (after its 8-byte length) for
// the payload, when the payload fits there: the encode writes where the bytes go on the wire.
class SlotArena final : public TorchArena {
 public:
  SlotArena(at::Device device, const at::Tensor& slot) : TorchArena(device), slot_(slot) {}
  void* payload(size_t bytes) override {
    if (bytes > static_cast<size_t>(slot_.numel() - kSlotHeaderBytes)) return allocate(bytes);
    return slot_.data_ptr<uint8_t>() + kSlotHeaderBytes;
  }

 private:
  at::Tensor slot_;
};

void check_on_device(const at::Tensor& t, const at::Device& device, const char* what) {
  TORCH_CHECK(t.device() == device && t.scalar_type() == at::kFloat && t.is_contiguous(), "gradzip: ", what,
              " must be a contiguous float32 tensor on ", device, ", got ", t.scalar_type(), " on ", t.device());
}

}  // namespace

namespace {

// codec's device half on x (and the residual) with memory from `arena`, on the current stream.
DevicePayload encode_with(TorchArena& arena, const Codec& codec, const at::Tensor& x, const at::Tensor& residual,
                          const EncodeContext& ctx) {
  TORCH_CHECK(x.is_cuda(), "gradzip: the GPU encoder takes a CUDA tensor, got one on ", x.device());
  check_on_device(x, x.device(), "the input");
  if (residual.defined()) {
    check_on_device(residual, x.device(), "the residual");
    TORCH_CHECK(residual.numel() == x.numel(), "gradzip: the residual has ", residual.numel(),
                " elements, the input ", x.numel());
  }
  const c10::cuda::CUDAGuard guard(x.device());
  return cuda::device_encode(codec, x.data_ptr<float>(), x.numel(),
                             residual.defined() ? residual.data_ptr<float>() : nullptr, ctx, arena,
                             c10::cuda::getCurrentCUDAStream(x.device().index()));
}

}  // namespace

at::Tensor encode_on_device(const Codec& codec, const at::Tensor& x, const at::Tensor& residual,
                            const EncodeContext& ctx) {
  TorchArena arena(x.device());
  const DevicePayload payload = encode_with(arena, codec, x, residual, ctx);
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

// Each slot's declared length and its payload's first bytes, read in one copy (one
// synchronization): what decoding needs on the host.
struct SlotHeads {
  SlotHeads(const at::Tensor& slots, int64_t stride, int rows) {
    TORCH_CHECK(slots.is_cuda() && slots.scalar_type() == at::kByte && slots.is_contiguous() &&
                    slots.numel() >= rows * stride && stride > kSlotHeaderBytes && stride % 8 == 0,
                "gradzip: the slots must be ", rows, " contiguous uint8 rows of ", stride, " bytes on a GPU");
    const c10::cuda::CUDAGuard guard(slots.device());
    bytes_per_row = static_cast<size_t>(
        kSlotHeaderBytes +
        std::min<int64_t>(static_cast<int64_t>(cuda::payload_prefix_bytes(stride)), stride - kSlotHeaderBytes));
    bytes = cuda::read_row_prefixes(slots.data_ptr<uint8_t>(), static_cast<size_t>(stride), rows, bytes_per_row,
                                    c10::cuda::getCurrentCUDAStream(slots.device().index()));
    for (int r = 0; r < rows; ++r) {
      uint64_t size;
      std::memcpy(&size, bytes.data() + r * bytes_per_row, 8);
      sizes.push_back(slot_payload_size(size, stride, r));
    }
  }
  // Row r's payload prefix, bytes_per_row apart from the next.
  const uint8_t* prefix(int r) const { return bytes.data() + r * bytes_per_row + kSlotHeaderBytes; }

  size_t bytes_per_row = 0;
  std::vector<uint8_t> bytes;
  std::vector<size_t> sizes;
};

class DeviceSlotCodec final : public SlotCodec {
 public:
  explicit DeviceSlotCodec(std::shared_ptr<const Codec> codec) : codec_(std::move(codec)) {}

  int64_t slot_bytes(int64_t n) const override { return gradzip::slot_bytes(*codec_, n); }
  std::unique_ptr<SlotCodec> part(int64_t, int64_t) const override {
    return std::make_unique<DeviceSlotCodec>(codec_);
  }

  void encode(const at::Tensor& x, const at::Tensor& residual, const EncodeContext& ctx,
              at::Tensor slot) const override {
    // The payload is written in the slot itself (SlotArena); a length, the zero padding.
    SlotArena arena(x.device(), slot);
    const DevicePayload payload = encode_with(arena, *codec_, x, residual, ctx);
    const auto size = static_cast<int64_t>(payload.size);
    check_slot_fits(size, slot.numel());
    TORCH_INTERNAL_ASSERT(payload.data == slot.data_ptr<uint8_t>() + kSlotHeaderBytes,
                          "gradzip: a payload within its codec's bound was not written in its slot");
    slot.narrow(0, 0, kSlotHeaderBytes).view(at::kLong).fill_(size);  // a fill kernel: no host copy
    slot.narrow(0, kSlotHeaderBytes + size, slot.numel() - kSlotHeaderBytes - size).zero_();
  }

  void decode_sum(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    decode_rows(slots, stride, rows, sum, scale, /*set=*/true);
  }

  void decode_add(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    decode_rows(slots, stride, rows, sum, scale, /*set=*/false);
  }

  // Every slot's kernels queued, then one read of all their checks.
  void decode_each(const at::Tensor& slots, int64_t stride, const std::vector<at::Tensor>& targets,
                   float scale) const override {
    const int rows = static_cast<int>(targets.size());
    const SlotHeads heads(slots, stride, rows);
    const at::Device device = slots.device();
    const c10::cuda::CUDAGuard guard(device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
    TorchArena arena(device);
    int* errors = cuda::decode_checks(rows, arena, stream);
    for (int r = 0; r < rows; ++r) {
      at::Tensor target = targets[r];
      check_on_device(target, device, "a piece of the sum");
      try {
        cuda::queue_decode_add(codec_->id(), slots.data_ptr<uint8_t>() + r * stride + kSlotHeaderBytes,
                               static_cast<size_t>(stride), {heads.sizes[r]}, target.data_ptr<float>(),
                               target.numel(), arena, stream, scale, /*set=*/true, heads.prefix(r),
                               heads.bytes_per_row, errors + r);
      } catch (const cuda::RankPayloadError& e) {
        throw SlotError(r, e.what());
      }
    }
    try {
      cuda::check_decoded(codec_->id(), errors, rows, stream);
    } catch (const cuda::RankPayloadError& e) {
      throw SlotError(e.rank(), e.what());
    }
  }

 private:
  // The rows' payloads added into `sum`, or (set) into zeros.
  void decode_rows(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale, bool set) const {
    const SlotHeads heads(slots, stride, rows);
    const at::Tensor payloads = slots.narrow(0, kSlotHeaderBytes, rows * stride - kSlotHeaderBytes);
    try {
      decode_add_on_device(codec_->id(), payloads, stride, heads.sizes, sum, scale, set, heads.prefix(0),
                           heads.bytes_per_row);
    } catch (const cuda::RankPayloadError& e) {
      throw SlotError(e.rank(), e.what());
    }
  }

  std::shared_ptr<const Codec> codec_;
};

}  // namespace

void record_on_current_stream(const at::Tensor& t) {
  t.record_stream(c10::cuda::getCurrentCUDAStream(t.device().index()));
}

std::unique_ptr<SlotCodec> device_slot_codec(std::shared_ptr<const Codec> codec) {
  TORCH_CHECK(cuda::has_device_half(*codec), "gradzip: the ", codec->name(), " codec has no GPU encoder");
  return std::make_unique<DeviceSlotCodec>(std::move(codec));
}

}  // namespace gradzip
