#include "aggregate/exact_allreduce.h"

#include <c10/util/Exception.h>

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

void check_reduce_scatter(const at::Tensor& output, const at::Tensor& input, const c10d::Backend& transport) {
  const int ranks = transport.getSize();
  TORCH_CHECK(input.numel() == output.numel() * ranks, "gradzip: reduce_scatter_tensor needs an input of ", ranks,
              " (ranks) x ", output.numel(), " (output) elements, got ", input.numel());
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "gradzip: reduce_scatter_tensor got an input of ",
              input.scalar_type(), " and an output of ", output.scalar_type());
  TORCH_CHECK(input.device() == output.device(), "gradzip: reduce_scatter_tensor got an input on ", input.device(),
              " and an output on ", output.device());
}

c10::intrusive_ptr<c10d::Work> exact_reduce_scatter(at::Tensor& output, at::Tensor& input,
                                                    const c10d::ReduceScatterOptions& opts,
                                                    const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats) {
  check_reduce_scatter(output, input, *transport);
  const int64_t others = transport->getSize() - 1;
  const int64_t moved = others * output.numel() * static_cast<int64_t>(output.element_size());
  stats.add(moved, moved, others * output.numel() * 4);
  return transport->_reduce_scatter_base(output, input, opts);
}

}  // namespace gradzip
