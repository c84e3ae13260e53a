// ExactAllreduce ("allreduce"): the transport's own all-reduce, unchanged. Its bytes
// are counted as a ring all-reduce of the tensor moves them (the transport's own
// algorithm is not observable from here).
#pragma once

#include "gradzip/aggregation.h"

namespace gradzip {

// transport->allreduce(tensors, opts), with its bytes added to `stats`.
c10::intrusive_ptr<c10d::Work> exact_allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                               const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats);

class ExactAllreduce final : public Aggregation {
 public:
  explicit ExactAllreduce(const BoundSpec& spec) : Aggregation(spec) {}

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                           const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                           const std::string&) override {
    return exact_allreduce(tensors, opts, transport, stats);
  }
};

}  // namespace gradzip
