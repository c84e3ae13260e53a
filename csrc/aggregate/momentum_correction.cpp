// Momentum correction (DGC, `momentum` m, with error feedback): before the encode the
// velocity u ← m·u + x becomes what is encoded; after it, a selection codec's sent
// positions are zeroed in u (factor masking). The velocity lives where the residual does.
#include "aggregate/momentum_correction.h"

#include <c10/util/Exception.h>

#include "aggregate/compressed_residuals.h"

namespace gradzip {

at::Tensor add_momentum(CompressedState& state, ExchangeCall& call, double momentum, const std::string& key,
                        bool masking, std::vector<int64_t>& sent) {
  const int64_t n = call.x.numel();
  if (!state.velocity.defined()) state.velocity = at::zeros({n}, call.x.options());
  TORCH_CHECK(state.velocity.numel() == n, "gradzip: the velocity of the tensor keyed '", key, "' has ",
              state.velocity.numel(), " elements, the tensor ", n);
  if (state.velocity.device() != call.x.device()) state.velocity = state.velocity.to(call.x.device());
  if (!state.velocity.is_cpu()) {
    used_on_current_stream(state.velocity).mul_(momentum).add_(call.x);
    call.x = state.velocity;
    return masking ? call.worker_residual + state.velocity : at::Tensor();
  }
  // On the host in one pass, rounded as mul_ then add_ round (no FMA: the build targets
  // x86-64 without it).
  if (!state.velocity.is_contiguous()) state.velocity = state.velocity.contiguous();  // as loaded
  TORCH_INTERNAL_ASSERT(call.x.is_contiguous() && call.x.scalar_type() == at::kFloat &&
                        state.velocity.scalar_type() == at::kFloat);
  float* u = state.velocity.data_ptr<float>();
  const float* x = call.x.data_ptr<float>();
  const float m = static_cast<float>(momentum);
  for (int64_t i = 0; i < n; ++i) u[i] = u[i] * m + x[i];
  call.x = state.velocity;
  if (masking) call.ctx.sent = &sent;
  return at::Tensor();
}

void mask_momentum(CompressedState& state, const ExchangeCall& call, const at::Tensor& unsent,
                   const std::vector<int64_t>& sent) {
  if (!state.velocity.is_cpu()) {
    state.velocity.masked_fill_(call.worker_residual.ne(unsent), 0.0);
    return;
  }
  float* u = state.velocity.data_ptr<float>();
  const int64_t n = state.velocity.numel();
  for (const int64_t i : sent) {
    TORCH_INTERNAL_ASSERT(i >= 0 && i < n, "gradzip: an encoder reported position ", i, " of ", n);
    u[i] = 0.0f;
  }
}

}  // namespace gradzip
