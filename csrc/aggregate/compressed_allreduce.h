// CompressedAllreduce: all-reduce through a codec (gradzip/codec.h).
//
// Each rank encodes its tensor (plus its error-feedback residual), the payloads are
// allgathered over the transport (their sizes first, then the payloads padded to the
// largest), and every rank decodes all of them in rank order into an fp32 sum, so all
// ranks end bitwise identical. AVG divides the sum by the world size; vote=majority
// (sign) returns the sign of the summed votes (0 on a tie). When a payload cannot be
// decoded, every rank raises the same error and the tensor's contents are unspecified.
//
// Compressed: fp32, fp16 and bf16 tensors (math in fp32, the result cast back) with
// SUM or AVG. Everything else — other dtypes, other ops, tensors below min_numel, the
// first `warmup` calls of each tensor — goes through the transport's exact all-reduce.
//
// CUDA tensors whose codec has GPU kernels (topk, stc, sign, qsgd) stay on the GPU in
// builds with CUDA: encoded on the current stream (residual kept on the device), the
// payloads allgathered over the transport (NCCL), decoded there in rank order; the
// Work's future carries the device, so consumers' streams wait for the result. Other
// codecs copy CUDA tensors to the host and back.
//
// Per-tensor state (residual, call count, step) is kept under the caller's key: the
// backend derives keys from the call sequence, the DDP hook uses bucket indices, the
// model-level API parameter names. state_dict()/load_state_dict() save and restore it.
#pragma once

#include "aggregate/stateful_aggregation.h"
#include "gradzip/codec.h"

namespace gradzip {

// One tensor's state: its residual (float32; on the CPU, or on the tensor's GPU when the
// codec has a device half; undefined until first used), its calls and its encodes.
struct CompressedState {
  at::Tensor residual;
  int64_t calls = 0;  // all-reduces so far, exact ones included
  uint64_t step = 0;  // compressed encodes so far: seeds the codec's random draws
  void save(const std::string& key, std::map<std::string, at::Tensor>& out) const;
  void load(const std::string& field, const at::Tensor& value, const std::string& name);
};

class CompressedAllreduce final : public StatefulAggregation<CompressedState> {
 public:
  explicit CompressedAllreduce(const BoundSpec& spec);

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                           const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                           const std::string& key) override;
  c10::intrusive_ptr<c10d::Work> allreduce_pieces(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                                  const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                                  const std::vector<TensorPiece>& pieces) override;

 private:
  // The all-reduce on `state`; `lock` holds mutex_ on entry and is released before any
  // communication.
  c10::intrusive_ptr<c10d::Work> run(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                     const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                     const std::string& key, std::unique_lock<std::mutex>& lock,
                                     CompressedState& state);
  c10::intrusive_ptr<c10d::Work> run_on_device(std::vector<at::Tensor>& tensors, c10d::ReduceOp::RedOpType op,
                                               const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                               const std::string& key, std::unique_lock<std::mutex>& lock,
                                               CompressedState& state);
  // Where this tensor's residual lives: its GPU when the codec has a device half, else the CPU.
  at::Device residual_device(const at::Tensor& tensor) const;

  std::shared_ptr<const Codec> codec_;
  bool error_feedback_;
  bool majority_;
  int64_t min_numel_;
  int64_t warmup_;
  uint64_t seed_;
};

// The spec keys every compressed aggregation takes, besides its codec's.
std::vector<SpecKey> compressed_aggregation_keys();

}  // namespace gradzip
