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
#include "codec/codec_base.h"
#include "gradzip/codec.h"

namespace gradzip {

class CompressedAllreduce final : public StatefulAggregation {
 public:
  explicit CompressedAllreduce(const Spec& spec);

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                           const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                           const std::string& key) override;
  // As StatefulAggregation's, with device-resident residuals copied to `residual` on the host.
  std::map<std::string, TensorState> state() const override;
  TensorState tensor_state(const std::string& key) const override;

 private:
  c10::intrusive_ptr<c10d::Work> allreduce_on_device(std::vector<at::Tensor>& tensors, c10d::ReduceOp::RedOpType op,
                                                    const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                                    const std::string& key, std::unique_lock<std::mutex>& lock,
                                                    TensorState& state);

  CodecParameters parameters_;
  std::unique_ptr<Codec> codec_;
  bool error_feedback_;
  bool majority_;
  int64_t min_numel_;
  int64_t warmup_;
  uint64_t seed_;
};

// The spec keys every compressed aggregation takes, besides its codec's.
const std::vector<std::string>& compressed_aggregation_keys();

}  // namespace gradzip
