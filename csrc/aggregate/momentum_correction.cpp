// Momentum correction (DGC, `momentum` m, with error feedback): before the encode the
// velocity u ← m·u + x becomes what is encoded; after it, a selection codec's sent
// positions are zeroed in u (factor masking). The velocity lives where the residual does;
// on the host an all-reduce writes the next u into a spare in the pass that checks its
// input, and takes it once the ranks agree.
#include "aggregate/momentum_correction.h"

#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "aggregate/compressed_residuals.h"
#include "codec/cpu_features.h"
#include "codec/element_math.cuh"

namespace gradzip {

void velocity_for(CompressedState& state, const at::Tensor& x, const std::string& key) {
  const int64_t n = x.numel();
  if (!state.velocity.defined()) state.velocity = at::zeros({n}, x.options());
  TORCH_CHECK(state.velocity.numel() == n, "gradzip: the velocity of the tensor keyed '", key, "' has ",
              state.velocity.numel(), " elements, the tensor ", n);
  if (state.velocity.device() != x.device()) state.velocity = state.velocity.to(x.device());
}

namespace {

// velocity_into_spare's pass: w = u·m + x (mul then add, no FMA), x checked and zeroed.
// Returns true when some x was Inf or NaN (the only floats whose exponent is all ones).
inline bool spare_step_scalar(const float* u, float* w, float* x, int64_t begin, int64_t end, float m) {
  uint32_t bad = 0;
  for (int64_t i = begin; i < end; ++i) {
    bad |= math::non_finite_bit(x[i]);
    w[i] = u[i] * m + x[i];
    x[i] = 0.0f;
  }
  return bad != 0;
}

// Above kStreamBytes the spare is written past the caches: the encoder reads it back
// only after the whole pass, from memory anyway.
template <bool kStream>
__attribute__((target("avx2"))) bool spare_step_avx2(const float* u, float* w, float* x, int64_t n, float m) {
  int64_t i = 0;
  bool bad = false;
  if constexpr (kStream) {  // streaming stores take 32-byte aligned addresses
    i = std::min(n, static_cast<int64_t>((32 - reinterpret_cast<uintptr_t>(w) % 32) % 32) / 4);
    bad = spare_step_scalar(u, w, x, 0, i, m);
  }
  const __m256 factor = _mm256_set1_ps(m);
  const __m256 zero = _mm256_setzero_ps();
  const __m256i exponent = _mm256_set1_epi32(0x7F800000);
  __m256i bad_lanes = _mm256_setzero_si256();
  for (; i + 8 <= n; i += 8) {
    const __m256 xs = _mm256_loadu_ps(x + i);
    bad_lanes = _mm256_or_si256(bad_lanes,
                                _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(xs), exponent), exponent));
    const __m256 next = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(u + i), factor), xs);
    if constexpr (kStream) {
      _mm256_stream_ps(w + i, next);
    } else {
      _mm256_storeu_ps(w + i, next);
    }
    _mm256_storeu_ps(x + i, zero);
  }
  if constexpr (kStream) _mm_sfence();
  bad = bad || !_mm256_testz_si256(bad_lanes, bad_lanes);
  return spare_step_scalar(u, w, x, i, n, m) || bad;
}

}  // namespace

at::Tensor add_momentum(CompressedState& state, ExchangeCall& call, double momentum, const std::string& key,
                        bool masking, std::vector<int64_t>& sent) {
  const int64_t n = call.x.numel();
  velocity_for(state, call.x, key);
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

bool velocity_into_spare(CompressedState& state, const at::Tensor& x, double momentum, const std::string& key) {
  velocity_for(state, x, key);
  if (!state.velocity.is_contiguous()) state.velocity = state.velocity.contiguous();  // as loaded
  const int64_t n = x.numel();
  if (!state.spare_velocity.defined() || state.spare_velocity.numel() != n) state.spare_velocity = at::empty({n}, x.options());
  TORCH_INTERNAL_ASSERT(x.is_cpu() && x.is_contiguous() && x.scalar_type() == at::kFloat &&
                        state.velocity.scalar_type() == at::kFloat && state.spare_velocity.is_contiguous());
  const float* u = state.velocity.data_ptr<float>();
  float* w = state.spare_velocity.data_ptr<float>();
  float* in = x.data_ptr<float>();
  const float m = static_cast<float>(momentum);
  if (!kHasAvx2) return !spare_step_scalar(u, w, in, 0, n, m);
  return n * 4 >= kStreamBytes ? !spare_step_avx2<true>(u, w, in, n, m) : !spare_step_avx2<false>(u, w, in, n, m);
}

void take_spare_velocity(CompressedState& state, ExchangeCall& call, bool masking, std::vector<int64_t>& sent) {
  std::swap(state.velocity, state.spare_velocity);
  call.x = state.velocity;
  if (masking) call.ctx.sent = &sent;
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
