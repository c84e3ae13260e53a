#include "aggregate/slot_codec.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <vector>

#include "codec/codec_base.h"
#include "codec/entry_codec.h"

#ifdef GRADZIP_WITH_CUDA
#include "aggregate/device_slot_codec.h"
#include "cuda/device_codec.h"
#endif

namespace gradzip {
namespace {

// The codec's CPU code on CPU tensors.
class HostSlotCodec final : public SlotCodec {
 public:
  explicit HostSlotCodec(std::shared_ptr<const Codec> codec)
      : codec_(std::move(codec)),
        elementwise_(dynamic_cast<const ElementwiseCodec*>(codec_.get())),
        entries_(dynamic_cast<const EntryCodec*>(codec_.get())) {}

  int64_t slot_bytes(int64_t n) const override { return gradzip::slot_bytes(*codec_, n); }
  std::unique_ptr<SlotCodec> part(int64_t, int64_t) const override {
    return std::make_unique<HostSlotCodec>(codec_);
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
    if (entries_) {  // written range by range: no zero fill, no scattered adds into the sum
      const Rows of(slots, stride, rows);
      return set_rows_by_range(*entries_, rows, [&](int r) { return of.payload(r); },
                               [&](int r) { return of.sizes[r]; }, sum.data_ptr<float>(), sum.numel(), scale, raise);
    }
    sum.zero_();
    decode_add(slots, stride, rows, sum, scale);
  }

  void decode_add(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    const Rows of(slots, stride, rows);
    const auto payload = [&](int r) { return of.payload(r); };
    const std::vector<size_t>& sizes = of.sizes;
    float* out = sum.data_ptr<float>();
    if (elementwise_ && rows > 1) {  // range by range: `sum` read and written once
      return add_rows_by_range(*elementwise_, rows, payload, [&](int r) { return sizes[r]; }, out, sum.numel(),
                               scale, raise);
    }
    for (int r = 0; r < rows; ++r) {
      try {
        codec_->decode_add(payload(r), sizes[r], out, sum.numel(), scale);
      } catch (const PayloadError& e) {
        raise(r, e);
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
  // Each row's payload and its size, as its slot declares it (else SlotError).
  struct Rows {
    Rows(const at::Tensor& slots, int64_t stride, int rows)
        : base(slots.data_ptr<uint8_t>()), stride(stride), sizes(rows) {
      for (int r = 0; r < rows; ++r) {
        uint64_t declared;
        std::memcpy(&declared, base + r * stride, 8);
        sizes[r] = slot_payload_size(declared, stride, r);
      }
    }
    const uint8_t* payload(int r) const { return base + r * stride + kSlotHeaderBytes; }
    const uint8_t* base;
    int64_t stride;
    std::vector<size_t> sizes;
  };
  static void raise(int r, const PayloadError& e) { throw SlotError(r, e.what()); }

  std::shared_ptr<const Codec> codec_;
  const ElementwiseCodec* elementwise_;  // codec_, when it decodes ranges; else null
  const EntryCodec* entries_;            // codec_, when its payloads are entries; else null
};

}  // namespace

at::Device codec_device([[maybe_unused]] const Codec& codec, const at::Tensor& tensor) {
#ifdef GRADZIP_WITH_CUDA
  if (tensor.is_cuda() && cuda::has_device_half(codec)) return tensor.device();
#endif
  return at::Device(at::kCPU);
}

std::unique_ptr<SlotCodec> slot_codec(const std::shared_ptr<const Codec>& codec, const at::Device& device) {
#ifdef GRADZIP_WITH_CUDA
  if (device.is_cuda()) return device_slot_codec(codec);
#endif
  TORCH_CHECK(device.is_cpu(), "gradzip: the ", codec->name(), " codec has no encoder for tensors on ", device);
  return std::make_unique<HostSlotCodec>(codec);
}

}  // namespace gradzip
