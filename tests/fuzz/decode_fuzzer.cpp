// libFuzzer target: one codec's decoder on arbitrary bytes (tests/fuzz/fuzz.sh builds one
// binary per codec, GRADZIP_FUZZ_CODEC = its id). The input's codec byte is set to the
// target's and its element count folded below 2^16, so the fuzzer's time goes into the
// codec's own sections. A decoder may refuse a payload only with PayloadError; any other
// exception, any out-of-bounds access or undefined behaviour (the sanitizers), and any
// input that takes longer than the decoder's cost bound, is a finding.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gradzip/codec.h"

#ifndef GRADZIP_FUZZ_CODEC
#error "GRADZIP_FUZZ_CODEC must name the codec id to fuzz"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> payload(data, data + size);  // exactly `size` bytes: reads beyond are caught
  uint64_t n = 0;
  if (payload.size() > 3) payload[3] = GRADZIP_FUZZ_CODEC;
  if (payload.size() >= gradzip::kPayloadHeaderBytes) {
    std::memcpy(&n, payload.data() + 8, 8);
    n %= uint64_t{1} << 16;
    std::memcpy(payload.data() + 8, &n, 8);
  }
  std::vector<float> out(n, 0.0f);
  const auto start = std::chrono::steady_clock::now();
  try {
    gradzip::decode_payload_add(payload.data(), payload.size(), out.data(), static_cast<int64_t>(n));
  } catch (const gradzip::PayloadError&) {
  }
  // docs/wire-format.md, "Decoder cost": time linear in the element count and the bytes,
  // for every codec and every input. The constants hold the worst legitimate input (a polar
  // code of 2^16 designed afresh) with the sanitizers' slowdown and this machine's noise
  // many times over; what they catch is a cost that grows faster than that.
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const double bound_ms = 250.0 + 0.1 * static_cast<double>(n) + 0.001 * static_cast<double>(size);
  if (ms > bound_ms) {
    std::fprintf(stderr, "decode_fuzzer: a slow input: %.1f ms for %llu elements and %zu bytes (bound %.1f ms)\n", ms,
                 static_cast<unsigned long long>(n), size, bound_ms);
    std::abort();
  }
  return 0;
}
