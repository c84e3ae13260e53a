// DirectAggregation: an Aggregation used directly, not through the gradzip backend — by
// the DDP comm hook and the model-level API — over whatever transport the caller's
// process group has, with byte counters of its own. Each call returns when its result
// is in place.
#pragma once

#include <memory>
#include <vector>

#include "gradzip/aggregation.h"

namespace gradzip {

class DirectAggregation {
 public:
  explicit DirectAggregation(const BoundSpec& spec) : aggregation_(make_aggregation(spec)) {}

  const Aggregation& aggregation() const { return *aggregation_; }
  Aggregation& aggregation() { return *aggregation_; }
  Stats& stats() { return stats_; }

  // Reduces `tensor` in place; `key` names its state.
  void allreduce(const at::Tensor& tensor, const std::string& key, const c10d::ReduceOp& op,
                 const c10::intrusive_ptr<c10d::Backend>& transport);
  // Reduces `tensor`, the concatenation of `pieces`, in place; each piece keeps its own state.
  void allreduce_pieces(const at::Tensor& tensor, const std::vector<TensorPiece>& pieces, const c10d::ReduceOp& op,
                        const c10::intrusive_ptr<c10d::Backend>& transport);

 private:
  std::unique_ptr<Aggregation> aggregation_;
  Stats stats_;
};

}  // namespace gradzip
