// libFuzzer target: one codec's decoder on arbitrary bytes (tests/fuzz/fuzz.sh builds one
// binary per codec, GRADZIP_FUZZ_CODEC = its id). The input's codec byte is set to the
// target's and its element count folded below 2^16, so the fuzzer's time goes into the
// codec's own sections. A decoder may refuse a payload only with PayloadError; any other
// exception, and any out-of-bounds access or undefined behaviour (the sanitizers), is a
// finding.
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
  try {
    gradzip::decode_payload_add(payload.data(), payload.size(), out.data(), static_cast<int64_t>(n));
  } catch (const gradzip::PayloadError&) {
  }
  return 0;
}
