// Non-finite input: the check, the header-only payload that stands for it, and the
// decoder entry that reads it (include/gradzip/codec.h).
#include <algorithm>
#include <cstring>
#include <limits>

#include "codec/wire.h"

namespace gradzip {

bool all_finite(const float* x, int64_t n) {
  // A float is Inf or NaN exactly when its exponent bits are all ones. The largest
  // exponent field over a block is one vectorized max; blocks let a bad step stop early.
  constexpr uint32_t kExponent = 0x7F800000u;
  constexpr int64_t kBlock = 1 << 14;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    uint32_t largest = 0;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, 4);
      largest = std::max(largest, bits & kExponent);
    }
    if (largest == kExponent) return false;
  }
  return true;
}

bool encode_unless_non_finite(const Codec& codec, const float* x, int64_t n, float* residual,
                              const EncodeContext& ctx, std::vector<uint8_t>& out) {
  if (all_finite(x, n)) {
    codec.encode(x, n, residual, ctx, out);
    return true;
  }
  wire::Writer(out).header(codec.id(), static_cast<uint64_t>(n), kNonFinitePayloadFlag);
  return false;
}

void decode_payload_add(const uint8_t* data, size_t size, float* out, int64_t n) {
  const PayloadHeader header = read_payload_header(data, size);
  if (!header.non_finite) {
    codec_for_payload(data, size)->decode_add(data, size, out, n);
    return;
  }
  if (header.numel != static_cast<uint64_t>(n)) {
    throw PayloadError("gradzip: invalid payload: it holds " + std::to_string(header.numel) +
                       " elements, the output has " + std::to_string(n));
  }
  std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace gradzip
