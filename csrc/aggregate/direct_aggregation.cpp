#include "aggregate/direct_aggregation.h"

namespace gradzip {

void DirectAggregation::allreduce(const at::Tensor& tensor, const std::string& key, const c10d::ReduceOp& op,
                                  const c10::intrusive_ptr<c10d::Backend>& transport) {
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  worker_.drain();
  aggregation_->allreduce(tensors, opts, transport, stats_, key)->wait();
}

void DirectAggregation::allreduce_pieces(const at::Tensor& tensor, const std::vector<TensorPiece>& pieces,
                                         const c10d::ReduceOp& op,
                                         const c10::intrusive_ptr<c10d::Backend>& transport) {
  std::vector<at::Tensor> tensors = {tensor};
  worker_.drain();
  run_pieces(tensors, pieces, op, transport)->wait();
}

void DirectAggregation::reduce_scatter(at::Tensor output, at::Tensor input, const std::string& key,
                                       const c10d::ReduceOp& op, const c10::intrusive_ptr<c10d::Backend>& transport,
                                       const std::vector<TensorPiece>& pieces) {
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = op;
  worker_.drain();
  const auto work = pieces.empty() ? aggregation_->reduce_scatter(output, input, opts, transport, stats_, key)
                                   : aggregation_->reduce_scatter_pieces(output, input, opts, transport, stats_, key,
                                                                         pieces);
  work->wait();
}

void DirectAggregation::use_node_levels(const c10::intrusive_ptr<c10d::Backend>& transport, NodeLevels levels) {
  worker_.drain();
  aggregation_->use_node_levels(transport, std::move(levels));
}

void DirectAggregation::set_loss_scale(double scale) {
  worker_.drain();
  aggregation_->set_loss_scale(scale);
}

std::map<std::string, at::Tensor> DirectAggregation::state_dict() {
  worker_.drain();
  return aggregation_->state_dict();
}

void DirectAggregation::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  worker_.drain();
  aggregation_->load_state_dict(state);
}

c10::intrusive_ptr<c10d::Work> DirectAggregation::submit_pieces(const at::Tensor& tensor,
                                                                const std::vector<TensorPiece>& pieces,
                                                                const c10d::ReduceOp& op,
                                                                const c10::intrusive_ptr<c10d::Backend>& transport) {
  std::vector<at::Tensor> tensors = {tensor};
  return worker_.submit(tensors, [this, tensors, pieces, op, transport]() mutable {
    run_pieces(tensors, pieces, op, transport)->wait();
  });
}

c10::intrusive_ptr<c10d::Work> DirectAggregation::run_pieces(std::vector<at::Tensor>& tensors,
                                                             const std::vector<TensorPiece>& pieces,
                                                             const c10d::ReduceOp& op,
                                                             const c10::intrusive_ptr<c10d::Backend>& transport) {
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  if (pieces.size() == 1) return aggregation_->allreduce(tensors, opts, transport, stats_, pieces.front().key);
  return aggregation_->allreduce_pieces(tensors, opts, transport, stats_, pieces);
}

}  // namespace gradzip
