// Non-finite input: the check, the header-only payload that stands for it, and the
// decoder entry that reads it (include/gradzip/codec.h).
#include <algorithm>
#include <limits>

#include "codec/cpu_features.h"
#include "codec/element_math.cuh"
#include "codec/wire.h"

namespace gradzip {

namespace {

constexpr int64_t kFiniteBlock = 1 << 14;  // elements checked between early exits

// Inf and NaN are the only floats whose exponent field is all ones. An OR of compares
// over a block vectorizes; blocks let a bad step stop early.
inline bool block_finite(const float* x, int64_t begin, int64_t end) {
  uint32_t bad = 0;
  for (int64_t i = begin; i < end; ++i) bad |= math::non_finite_bit(x[i]);
  return bad == 0;
}

// The same loop compiled for AVX2 (32-byte compares): at the read bandwidth of one core
// here, where the baseline x86-64 build runs at about half of it.
__attribute__((target("avx2"))) bool all_finite_avx2(const float* x, int64_t n) {
  for (int64_t b = 0; b < n; b += kFiniteBlock) {
    if (!block_finite(x, b, std::min(n, b + kFiniteBlock))) return false;
  }
  return true;
}

bool all_finite_baseline(const float* x, int64_t n) {
  for (int64_t b = 0; b < n; b += kFiniteBlock) {
    if (!block_finite(x, b, std::min(n, b + kFiniteBlock))) return false;
  }
  return true;
}

}  // namespace

bool all_finite(const float* x, int64_t n) { return kHasAvx2 ? all_finite_avx2(x, n) : all_finite_baseline(x, n); }

bool encode_unless_non_finite(const Codec& codec, const float* x, int64_t n, float* residual,
                              const EncodeContext& ctx, std::vector<uint8_t>& out) {
  if (all_finite(x, n)) {
    codec.encode(x, n, residual, ctx, out);
    return true;
  }
  wire::Writer(out).header(codec.id(), static_cast<uint64_t>(n), kNonFinitePayloadFlag);
  return false;
}

size_t encode_into_unless_non_finite(const Codec& codec, const float* x, int64_t n, float* residual,
                                     const EncodeContext& ctx, uint8_t* out, size_t capacity, bool& finite) {
  finite = all_finite(x, n);
  if (finite) return codec.encode_into(x, n, residual, ctx, out, capacity);
  wire::Writer w(out, capacity);
  w.header(codec.id(), static_cast<uint64_t>(n), kNonFinitePayloadFlag);
  return w.size();
}

void decode_payload_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) {
  const PayloadHeader header = read_payload_header(data, size);
  if (!header.non_finite) {
    codec_for_payload(data, size)->decode_add(data, size, out, n, scale);
    return;
  }
  if (header.numel != static_cast<uint64_t>(n)) {
    throw PayloadError("gradzip: invalid payload: it holds " + std::to_string(header.numel) +
                       " elements, the output has " + std::to_string(n));
  }
  std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace gradzip
