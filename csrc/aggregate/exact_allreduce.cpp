#include "aggregate/exact_allreduce.h"

namespace gradzip {

c10::intrusive_ptr<c10d::Work> ExactAllreduce::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
    const c10::intrusive_ptr<c10d::Backend>& transport) {
  return transport->allreduce(tensors, opts);
}

}  // namespace gradzip
