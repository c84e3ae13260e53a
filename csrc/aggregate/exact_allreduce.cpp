#include "aggregate/exact_allreduce.h"

namespace gradzip {

c10::intrusive_ptr<c10d::Work> exact_allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                               const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats) {
  int64_t bytes = 0, numel = 0;
  for (const auto& t : tensors) {
    bytes += t.numel() * static_cast<int64_t>(t.element_size());
    numel += t.numel();
  }
  const int ranks = transport->getSize();
  const int64_t moved = ring_allreduce_bytes(bytes, ranks);
  stats.add(moved, moved, ring_allreduce_bytes(numel * 4, ranks));
  return transport->allreduce(tensors, opts);
}

}  // namespace gradzip
