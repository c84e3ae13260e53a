#include "aggregate/direct_aggregation.h"

namespace gradzip {

void DirectAggregation::allreduce(const at::Tensor& tensor, const std::string& key, const c10d::ReduceOp& op,
                                  const c10::intrusive_ptr<c10d::Backend>& transport) {
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  aggregation_->allreduce(tensors, opts, transport, stats_, key)->wait();
}

void DirectAggregation::allreduce_pieces(const at::Tensor& tensor, const std::vector<TensorPiece>& pieces,
                                         const c10d::ReduceOp& op,
                                         const c10::intrusive_ptr<c10d::Backend>& transport) {
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  aggregation_->allreduce_pieces(tensors, opts, transport, stats_, pieces)->wait();
}

}  // namespace gradzip
