// Error feedback's residuals: a CompressedState's worker residual, float32 on the device
// its codec runs on, and its owner residual, which goes back into the worker residual
// when the owned chunk moves, so that what was not sent is sent later instead of lost.
#include "aggregate/compressed_residuals.h"

#include <c10/util/Exception.h>

#ifdef GRADZIP_WITH_CUDA
#include "aggregate/device_slot_codec.h"
#endif

namespace gradzip {

const at::Tensor& used_on_current_stream(const at::Tensor& t) {
#ifdef GRADZIP_WITH_CUDA
  if (t.defined() && t.is_cuda()) record_on_current_stream(t);
#endif
  return t;
}

at::Tensor& residual_on(CompressedState& state, const at::Device& device, int64_t n, const std::string& key) {
  if (!state.residual.defined()) state.residual = at::zeros({n}, at::dtype(at::kFloat).device(device));
  TORCH_CHECK(state.residual.numel() == n, "gradzip: the tensor keyed '", key, "' had ", state.residual.numel(),
              " elements and now has ", n, "; a key must always name a tensor of the same size");
  if (state.residual.device() != device) state.residual = state.residual.to(device);
  used_on_current_stream(state.residual);
  return state.residual;
}

void own_chunk(CompressedState& state, const Chunk& owned, const at::Device& device, int64_t n,
               const std::string& key) {
  if (state.owner_residual.defined() &&
      (state.owner_offset != owned.begin || state.owner_residual.numel() != owned.length)) {
    TORCH_CHECK(state.owner_offset >= 0 && state.owner_offset + state.owner_residual.numel() <= n,
                "gradzip: the owner residual of the tensor keyed '", key, "' covers elements ", state.owner_offset,
                " to ", state.owner_offset + state.owner_residual.numel(), " of a tensor of ", n);
    residual_on(state, device, n, key).narrow(0, state.owner_offset, state.owner_residual.numel())
        .add_(used_on_current_stream(state.owner_residual).to(device));
    state.owner_residual = at::Tensor();
  }
  if (owned.length == 0) return;
  if (!state.owner_residual.defined()) {
    state.owner_residual = at::zeros({owned.length}, at::dtype(at::kFloat).device(device));
    state.owner_offset = owned.begin;
  }
  if (state.owner_residual.device() != device) state.owner_residual = state.owner_residual.to(device);
  used_on_current_stream(state.owner_residual);
}

}  // namespace gradzip
