// Loss-scale handling (mixed precision): set_loss_scale records the scale the gradients
// are in; before a call uses a tensor's state, its residuals and velocity are brought
// from the scale they were kept in to that one, so what was not sent keeps its value.
#include <c10/util/Exception.h>

#include <cmath>

#include "aggregate/compressed_allreduce.h"
#include "aggregate/compressed_residuals.h"

namespace gradzip {

void CompressedAllreduce::set_loss_scale(double scale) {
  TORCH_CHECK(std::isfinite(scale) && scale > 0, "gradzip: a loss scale must be finite and above 0, got ", scale);
  std::lock_guard<std::mutex> lock(mutex_);
  loss_scale_ = scale;
}

void CompressedAllreduce::follow_loss_scale(CompressedState& state) const {
  if (state.loss_scale == loss_scale_) return;
  const double ratio = loss_scale_ / state.loss_scale;
  for (at::Tensor* t : {&state.residual, &state.owner_residual, &state.velocity}) {
    if (t->defined()) used_on_current_stream(*t).mul_(ratio);
  }
  state.loss_scale = loss_scale_;
}

}  // namespace gradzip
