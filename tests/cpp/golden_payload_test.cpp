// The wire format does not move: for a fixed input, residual, seed and step, every
// codec writes exactly the bytes recorded when this test was written (their FNV-1a
// hashes), and leaves exactly the recorded residual. A change here is a wire-format
// change: bump kWireVersion and docs/wire-format.md instead of updating the hashes.
#include <gtest/gtest.h>

#include <cstring>

#include "gradzip/codec.h"

namespace gradzip {
namespace {

uint64_t fnv1a(const void* data, size_t size, uint64_t hash = 0xcbf29ce484222325ull) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

// A portable input: xorshift64 bits to floats in (-2, 2), with some exact zeros, ties
// and one huge value, so selection, signs, blocks and buckets all see edge cases.
std::vector<float> golden_input(int64_t n, uint64_t seed) {
  std::vector<float> x(n);
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[i] = static_cast<float>(static_cast<int64_t>(s >> 40) - (int64_t{1} << 23)) / static_cast<float>(1 << 22);
    if (i % 97 == 0) x[i] = 0.0f;
    if (i % 89 == 0) x[i] = 0.75f;
  }
  x[n / 3] = 1e6f;
  return x;
}

struct Golden {
  const char* spec;
  uint64_t plain;          // hash of the two payloads without error feedback
  uint64_t with_feedback;  // hash of the two payloads with error feedback, then of the residual left
};

// Two encodes of the same tensor (steps 7 and 8), the second with the residual the first left.
void encode_twice(const std::string& spec, bool error_feedback, uint64_t& payload_hash, uint64_t& residual_hash) {
  const int64_t n = 4133;  // not a multiple of 8, 32, block or bucket
  const auto codec = make_codec(parse_spec(spec));
  std::vector<float> residual(n, 0.0f);
  payload_hash = 0xcbf29ce484222325ull;
  for (uint64_t step = 7; step < 9; ++step) {
    const auto x = golden_input(n, 0x9E3779B97F4A7C15ull + step);
    std::vector<uint8_t> out;
    codec->encode(x.data(), n, error_feedback ? residual.data() : nullptr, EncodeContext{1234, step, 3}, out);
    payload_hash = fnv1a(out.data(), out.size(), payload_hash);
  }
  residual_hash = error_feedback ? fnv1a(residual.data(), residual.size() * 4) : 0;
}

TEST(GoldenPayloadTest, BytesAndResidualsAreUnchanged) {
  const Golden golden[] = {
      {"identity", 0xfe692efed0d3eea5ull, 0x348329f896bb5b09ull},
      {"fp16", 0x6bf155503b696ad4ull, 0xeff23cfb60b614f3ull},
      {"bf16", 0xf736b790f99df148ull, 0x5f74c17c60cbb6ddull},
      {"topk:density=0.01", 0x8b697bf25afd5e2bull, 0xff837f7f7dcaf153ull},
      {"topk:density=0.2,approx=1", 0x76cc06d1e47db99aull, 0xd5be6f8121dabf0eull},
      {"randomk:density=0.05", 0xd406dc05227c6252ull, 0xd167a895881ab829ull},
      {"randomk:density=0.05,unbiased=0", 0x602692c12662fc46ull, 0xaab6756c4020886bull},
      {"stc:density=0.01", 0x84f6844e0ac3a308ull, 0x5d010a55da9b8b43ull},
      {"stc:density=0.6", 0xa12af8bfd4c96b1bull, 0x38aa0db835812cb5ull},
      {"stc:density=0.05,approx=1", 0x1a1d8956396ec39eull, 0xc014771b925c3980ull},
      {"sign", 0x15faea4ec442a859ull, 0x5fd2050e35389534ull},
      {"sign:vote=majority", 0x23995b53735a18e6ull, 0x9e1333ccf4fc88f3ull},
      {"sign:block=100", 0x89e470a8372b9ffeull, 0x834dd4f4ad300a0eull},
      {"qsgd:bits=4", 0x4d103942c298e23cull, 0xce5c15ca8f2f1817ull},
      {"qsgd:bits=8,bucket=128", 0x7456a197678753daull, 0xb1813a334a545dfeull},
      {"qsgd:levels=1,norm=max", 0x80f231b35a99e5b4ull, 0x15023c088f8c7669ull},
      {"qsgd:bits=3,bucket=100", 0x4ca9318617d66500ull, 0x4bac1194d508e772ull},
  };
  for (const auto& g : golden) {
    for (bool error_feedback : {false, true}) {
      uint64_t payloads = 0, residual = 0;
      encode_twice(g.spec, error_feedback, payloads, residual);
      const uint64_t expected = error_feedback ? g.with_feedback : g.plain;
      const uint64_t actual = error_feedback ? fnv1a(&residual, 8, payloads) : payloads;
      EXPECT_EQ(actual, expected) << g.spec << (error_feedback ? " with" : " without") << " error feedback: 0x"
                                  << std::hex << actual;
    }
  }
}

}  // namespace
}  // namespace gradzip
