// Momentum correction (DGC), internal to csrc/aggregate: the velocity's two steps around a
// compressed encode, for the all-reduce and the reduce-scatter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "aggregate/compressed_allreduce.h"

namespace gradzip {

// The state's velocity for an n-element x: zeros at first, on x's device.
void velocity_for(CompressedState& state, const at::Tensor& x, const std::string& key);

// Momentum correction, before the encode: u ← m·u + x becomes what is encoded. With
// `masking` (selection codecs) the velocity is zeroed where the encode sends something
// (factor masking, mask_momentum): on the host the encoders report those positions into
// `sent` (call.ctx.sent); on a device, where they do not, this returns what the worker
// residual will hold where nothing is sent (residual + u), to find them by.
at::Tensor add_momentum(CompressedState& state, ExchangeCall& call, double momentum, const std::string& key,
                        bool masking, std::vector<int64_t>& sent);

// The same first step on the host, fused with what an all-reduce does to its input before
// the ranks agree on finiteness, for a float32 x that is also the sum the exchange writes
// (in place): in one pass over x, m·u + x into the state's spare velocity (u untouched,
// so a step the ranks refuse changes no state), x checked for Inf and NaN, and x zeroed
// (the exchange adds the payloads into it: ExchangeCall::sum_zeroed). Returns whether x
// was finite. Rounded as add_momentum rounds: the same bits.
bool velocity_into_spare(CompressedState& state, const at::Tensor& x, double momentum, const std::string& key);

// After the ranks agreed to take the step: the spare becomes the velocity and what is
// encoded, as add_momentum leaves them (the old velocity's storage is the next spare).
void take_spare_velocity(CompressedState& state, ExchangeCall& call, bool masking, std::vector<int64_t>& sent);

// Factor masking, after the encode: u is zeroed where the encode sent something. On the
// host at the positions the encoders reported: a tensor of pieces (layer-aware) reports
// only from the pieces whose codec selects, so a piece sent whole (a small one, exact)
// keeps u, as momentum SGD's buffer, where masking would reset it every step and leave
// that parameter no momentum at all. On a device (one codec, which selects) where the
// residual no longer holds residual + u (`unsent`).
void mask_momentum(CompressedState& state, const ExchangeCall& call, const at::Tensor& unsent,
                   const std::vector<int64_t>& sent);

}  // namespace gradzip
