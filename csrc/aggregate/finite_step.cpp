#include "aggregate/finite_step.h"

#include <vector>

#include "gradzip/codec.h"

namespace gradzip {

bool locally_finite(const at::Tensor& x) {
  if (x.is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous()) return all_finite(x.data_ptr<float>(), x.numel());
  return at::isfinite(x).all().item<bool>();
}

bool finite_on_every_rank(const at::Tensor& x, const c10::intrusive_ptr<c10d::Backend>& transport,
                          const at::Device& transport_device) {
  return finite_on_every_rank(locally_finite(x), transport, transport_device);
}

bool finite_on_every_rank(bool finite_here, const c10::intrusive_ptr<c10d::Backend>& transport,
                          const at::Device& transport_device) {
  std::vector<at::Tensor> flag = {at::full({1}, finite_here ? 0 : 1, at::dtype(at::kInt).device(transport_device))};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  transport->allreduce(flag, max)->wait();
  return flag.front().item<int>() == 0;
}

}  // namespace gradzip
