// ExactAllreduce ("allreduce"): the transport's own all-reduce, unchanged.
#pragma once

#include "gradzip/aggregation.h"

namespace gradzip {

class ExactAllreduce final : public Aggregation {
 public:
  explicit ExactAllreduce(const Spec& spec) : Aggregation(spec) {}

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
      const c10::intrusive_ptr<c10d::Backend>& transport) override;
};

}  // namespace gradzip
