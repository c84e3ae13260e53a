// ExactAllreduce ("allreduce"): the transport's own all-reduce, unchanged; and the exact
// reduce-scatter every aggregation falls back to. Its bytes
// are counted as a ring all-reduce of the tensor moves them (the transport's own
// algorithm is not observable from here).
#pragma once

#include "gradzip/aggregation.h"

namespace gradzip {

// transport->allreduce(tensors, opts), with its bytes added to `stats`.
c10::intrusive_ptr<c10d::Work> exact_allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                               const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats);

// Throws unless `input` holds `transport`'s ranks × output.numel() elements of output's
// dtype on output's device.
void check_reduce_scatter(const at::Tensor& output, const at::Tensor& input, const c10d::Backend& transport);

// transport->_reduce_scatter_base(output, input, opts), with its bytes added to `stats`
// (a ring: (P − 1) × output's bytes).
c10::intrusive_ptr<c10d::Work> exact_reduce_scatter(at::Tensor& output, at::Tensor& input,
                                                    const c10d::ReduceScatterOptions& opts,
                                                    const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats);

class ExactAllreduce final : public Aggregation {
 public:
  explicit ExactAllreduce(const BoundSpec& spec) : Aggregation(spec) {}

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                           const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                           const std::string&, std::optional<bool>) override {
    return exact_allreduce(tensors, opts, transport, stats);
  }
};

}  // namespace gradzip
