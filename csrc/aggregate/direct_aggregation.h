// DirectAggregation: an Aggregation used directly, not through the gradzip backend — by
// the DDP comm hook and the model-level API — over whatever transport the caller's
// process group has, with byte counters of its own. allreduce(), allreduce_pieces() and
// reduce_scatter() return when the result is in place; submit_pieces() returns at once and runs on a
// worker thread (work/ordered_worker.h), in submission order, after every call
// submitted before it. The synchronous calls wait for submitted ones first. Bound as
// gradzip._C.Aggregation, which gradzip.Aggregation, the hook's State and the FSDP door's
// State drive.
#pragma once

#include <memory>
#include <vector>

#include "work/ordered_worker.h"
#include "gradzip/aggregation.h"

namespace gradzip {

class DirectAggregation {
 public:
  explicit DirectAggregation(const BoundSpec& spec) : aggregation_(make_aggregation(spec)) {}

  const Aggregation& aggregation() const { return *aggregation_; }
  Aggregation& aggregation() { return *aggregation_; }
  Stats& stats() { return stats_; }
  // The aggregation's use_node_levels() once every submitted call has finished.
  void use_node_levels(const c10::intrusive_ptr<c10d::Backend>& transport, NodeLevels levels);
  // The aggregation's set_loss_scale() once every submitted call has finished.
  void set_loss_scale(double scale);
  // The aggregation's state_dict() / load_state_dict() once every submitted call has finished.
  std::map<std::string, at::Tensor> state_dict();
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

  // Reduces `tensor` in place; `key` names its state.
  void allreduce(const at::Tensor& tensor, const std::string& key, const c10d::ReduceOp& op,
                 const c10::intrusive_ptr<c10d::Backend>& transport);
  // Reduces `tensor`, the concatenation of `pieces`, in place; each piece keeps its own state.
  void allreduce_pieces(const at::Tensor& tensor, const std::vector<TensorPiece>& pieces, const c10d::ReduceOp& op,
                        const c10::intrusive_ptr<c10d::Backend>& transport);
  // Reduces `input` (ranks × output.numel() elements) into this rank's `output` chunk;
  // `key` names its state (FSDP: one key per module). `pieces`: each chunk's layout
  // (Aggregation::reduce_scatter_pieces), or empty.
  void reduce_scatter(at::Tensor output, at::Tensor input, const std::string& key, const c10d::ReduceOp& op,
                      const c10::intrusive_ptr<c10d::Backend>& transport, const std::vector<TensorPiece>& pieces);
  // allreduce_pieces on the worker thread (one piece: the tensor as one key); CUDA
  // tensors there on a side stream ordered after the caller's current stream.
  c10::intrusive_ptr<c10d::Work> submit_pieces(const at::Tensor& tensor, const std::vector<TensorPiece>& pieces,
                                               const c10d::ReduceOp& op,
                                               const c10::intrusive_ptr<c10d::Backend>& transport);

 private:
  c10::intrusive_ptr<c10d::Work> run_pieces(std::vector<at::Tensor>& tensors, const std::vector<TensorPiece>& pieces,
                                            const c10d::ReduceOp& op,
                                            const c10::intrusive_ptr<c10d::Backend>& transport);

  std::unique_ptr<Aggregation> aggregation_;
  Stats stats_;
  OrderedWorker worker_;  // last: its jobs use the members above until it is gone
};

}  // namespace gradzip
