// The element math shared with the CUDA kernels, against torch's own conversions and
// the published Philox known answers.
#include "codec/element_math.cuh"
#include "codec/bitpack.h"
#include "codec/philox_block.h"
#include "codec/qsgd_codec.h"
#include "codec/sign_codec.h"
#include "gradzip/codec.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

namespace gradzip::math {
namespace {

std::vector<float> interesting_floats() {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 5.96e-8f, 2.98e-8f,
                               6.1e-5f, 6.097e-5f, std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(), 3.0e38f, 1.00048828125f, 1.000732421875f};
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_float(bits(rng));
    if (!std::isnan(f)) values.push_back(f);
  }
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (int i = 0; i < 100000; ++i) values.push_back(normal(rng));
  return values;
}

TEST(ElementMathTest, HalfMatchesTorch) {
  for (float f : interesting_floats()) {
    const uint16_t ours = float_to_half(f);
    ASSERT_EQ(ours, c10::Half(f).x) << f;
    ASSERT_EQ(float_bits(half_to_float(ours)), float_bits(static_cast<float>(c10::Half(f)))) << f;
  }
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t f16c_from_float(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
__attribute__((target("f16c"))) float f16c_to_float(uint16_t h) { return _cvtsh_ss(h); }

// The CPU fp16 codec converts with F16C where the host has it and with the element math
// elsewhere (the tail, hosts without it, the GPU): NaNs too must come out alike.
TEST(ElementMathTest, HalfNansAreF16cs) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this host has no F16C";
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> payload(1, 0x7fffff);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t nan = (i % 2 ? 0xff800000u : 0x7f800000u) | (i < 64 ? 1u << (i % 23) : payload(rng));
    ASSERT_EQ(float_to_half(bits_float(nan)), f16c_from_float(bits_float(nan))) << std::hex << nan;
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16c_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_bits(half_to_float(static_cast<uint16_t>(h))), float_bits(f)) << std::hex << h;
    ASSERT_EQ(float_to_half(f), f16c_from_float(f)) << std::hex << h;
  }
}
#endif

TEST(ElementMathTest, Bf16MatchesTorch) {
  for (float f : interesting_floats()) {
    ASSERT_EQ(float_to_bf16(f), c10::BFloat16(f).x) << f;
    ASSERT_EQ(float_bits(bf16_to_float(float_to_bf16(f))), float_bits(static_cast<float>(c10::BFloat16(f))));
  }
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

TEST(ElementMathTest, PhiloxKnownAnswers) {
  // Known-answer vectors of Philox4x32-10 (Salmon et al., SC'11, Random123).
  auto a = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(a.v[0], 0x6627e8d5u);
  EXPECT_EQ(a.v[1], 0xe169c58du);
  EXPECT_EQ(a.v[2], 0xbc57ac4cu);
  EXPECT_EQ(a.v[3], 0x9b00dbd8u);
  auto b = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(b.v[0], 0xd16cfe09u);
  EXPECT_EQ(b.v[1], 0x94fdccebu);
  EXPECT_EQ(b.v[2], 0x5001e420u);
  EXPECT_EQ(b.v[3], 0x24126ea1u);
}

TEST(ElementMathTest, MagnitudeKeyOrdersLikeAbs) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (int i = 0; i < 100000; ++i) {
    const float a = normal(rng), b = normal(rng);
    ASSERT_EQ(magnitude_key(a) < magnitude_key(b), std::fabs(a) < std::fabs(b));
  }
  EXPECT_GT(magnitude_key(std::nanf("")), magnitude_key(std::numeric_limits<float>::infinity()));
  EXPECT_EQ(nonnegative_bit(0.0f), 1u);
  EXPECT_EQ(nonnegative_bit(-0.0f), 0u);
}

TEST(ElementMathTest, QsgdLevelIsUnbiasedAndBounded) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (float ratio : {0.0f, 0.1f, 0.33f, 0.5f, 0.99f, 1.0f}) {
    double sum = 0;
    const int draws = 200000;
    for (int i = 0; i < draws; ++i) {
      const uint32_t level = qsgd_level(ratio, 7, uniform(rng));
      ASSERT_LE(level, 7u);
      sum += level;
    }
    EXPECT_NEAR(sum / draws, ratio * 7, 0.02) << ratio;
  }
  EXPECT_EQ(qsgd_level(std::nanf(""), 7, 0.5f), 0u);
}


TEST(ElementMathTest, QsgdCodeIsLevelAndSign) {
  const uint32_t sign_bit = 1u << 3;
  EXPECT_EQ(qsgd_code(0.5f, 1.0f, 7, sign_bit, 0u), 4u);                       // 3.5 rounds up with u = 0
  EXPECT_EQ(qsgd_code(-0.5f, 1.0f, 7, sign_bit, 0xffffffffu), 3u | sign_bit);  // and down with u near 1
  EXPECT_EQ(qsgd_code(-0.0f, 0.0f, 7, sign_bit, 0u), sign_bit);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 10000; ++i) {
    const float v = normal(rng);
    const uint32_t random = rng();
    const uint32_t code = qsgd_code(v, 0.25f, 127, 1u << 7, random);
    ASSERT_EQ(code & 127u, qsgd_level(std::fabs(v) * 0.25f, 127, uniform01(random)));
    ASSERT_EQ(code >> 7, v < 0.0f ? 1u : 0u);
  }
}

TEST(ElementMathTest, QsgdCountersStartAtBucketQuads) {
  EXPECT_EQ(qsgd_philox_counter(0, 0), 0u);
  EXPECT_EQ(qsgd_philox_counter(7, 0), 4u);
  EXPECT_EQ(qsgd_philox_counter(10, 10), 10u);  // a bucket of 10 starts its own quads
  EXPECT_EQ(qsgd_philox_counter(13, 10), 10u);
  EXPECT_EQ(qsgd_philox_counter(14, 10), 14u);
}

TEST(ElementMathTest, RadixDigitsRebuildTheKey) {
  std::mt19937 rng(13);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t key = rng() & 0x7fffffffu;
    uint32_t rebuilt = 0;
    for (int pass = 0; pass < kRadixPasses; ++pass) {
      const uint32_t digit = radix_digit(key, pass);
      ASSERT_LT(digit, radix_buckets(pass));
      ASSERT_EQ(rebuilt, key & radix_decided_mask(pass));
      rebuilt |= digit << radix_shift(pass);
    }
    ASSERT_EQ(rebuilt, key);
    ASSERT_EQ(radix_decided_mask(kRadixPasses), 0x7fffffffu);
  }
}

TEST(ElementMathTest, RiceStateMachineEndsCodesWhereTheyEnd) {
  std::mt19937 rng(17);
  for (int b : {0, 1, 3, 6, 13}) {
    std::vector<uint8_t> stream;
    bitpack::BitWriter bits(stream);
    std::vector<uint64_t> ends;
    uint64_t at = 0;
    for (int j = 0; j < 2000; ++j) {
      const uint64_t gap = rng() % (uint64_t{40} << b);
      bits.put_ones(gap >> b);
      bits.put(0, 1);
      if (b) bits.put(gap & ((uint64_t{1} << b) - 1), b);
      at += golomb_rice_bits(gap, b);
      ends.push_back(at);
    }
    bits.flush();
    std::vector<uint64_t> found;
    uint32_t state = 0;
    for (uint64_t p = 0; p < at; ++p) {
      bool completed = false;
      state = rice_next_state(state, (stream[p / 8] >> (p % 8)) & 1u, b, completed);
      if (completed) found.push_back(p + 1);
    }
    EXPECT_EQ(found, ends) << "b = " << b;
    EXPECT_EQ(state, 0u);
  }
}

TEST(ElementMathTest, GolombRiceBitsCountTheCode) {
  EXPECT_EQ(golomb_rice_bits(0, 0), 1u);
  EXPECT_EQ(golomb_rice_bits(5, 0), 6u);
  EXPECT_EQ(golomb_rice_bits(5, 2), 1u + 1u + 2u);
  EXPECT_EQ(golomb_rice_bits(uint64_t{1} << 40, 40), 1u + 1u + 40u);
}

}  // namespace
}  // namespace gradzip::math

namespace gradzip {
namespace {

TEST(PhiloxBlockTest, MatchesOneGroupAtATime) {
  uint32_t words[kPhiloxWords];
  for (uint64_t first : {uint64_t{0}, uint64_t{4}, uint64_t{1000003}, (uint64_t{1} << 32) - 8}) {
    philox_words(first, 7, 3, 0x123456789abcdefULL, words);
    for (int lane = 0; lane < kPhiloxWords / 4; ++lane) {
      const uint64_t counter = first + 4 * lane;
      const auto r = math::philox4x32_10(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 7, 3,
                                         0x89abcdefu, 0x01234567u);
      for (int w = 0; w < 4; ++w) ASSERT_EQ(words[4 * lane + w], r.v[w]) << first << " lane " << lane;
    }
  }
}

}  // namespace
}  // namespace gradzip

namespace gradzip {
namespace {

// BitReader reads words at a time: the same values, positions and failures as reading
// the stream bit by bit, including runs of ones longer than a word and truncation.
TEST(BitReaderTest, WordReadsMatchBitByBit) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> stream(1 + rng() % 40);
    for (auto& byte : stream) byte = static_cast<uint8_t>(trial % 3 == 0 ? 0xFF : rng());
    const uint64_t size = rng() % (stream.size() + 1);
    bitpack::BitReader fast(stream.data(), size);
    uint64_t position = 0;  // the reference reader, bit by bit
    bool failed = false;
    const auto bit = [&]() -> uint64_t {
      if (position >= size * 8) {
        failed = true;
        return 0;
      }
      const uint64_t value = (stream[position / 8] >> (position % 8)) & 1u;
      ++position;
      return value;
    };
    for (int op = 0; op < 30; ++op) {
      if (rng() % 2) {
        uint64_t ones = 0;
        while (bit()) ++ones;
        ASSERT_EQ(fast.get_ones(), ones) << trial;
      } else {
        const int width = static_cast<int>(rng() % 65);
        uint64_t value = 0;
        for (int b = 0; b < width; ++b) value |= bit() << b;
        ASSERT_EQ(fast.get(width), value) << trial << " width " << width;
      }
      ASSERT_EQ(fast.bits_read(), position) << trial;
      ASSERT_EQ(fast.failed(), failed) << trial;
    }
  }
}

// Code i of `width` bits in a little-endian bit stream, read bit by bit.
uint32_t code_bits(const uint8_t* stream, int64_t i, int width) {
  uint32_t code = 0;
  for (int k = 0; k < width; ++k) {
    const uint64_t bit = static_cast<uint64_t>(i) * width + k;
    code |= static_cast<uint32_t>((stream[bit / 8] >> (bit % 8)) & 1u) << k;
  }
  return code;
}

// unpack_codes reads eight codes per load where whole groups fit and the rest code by
// code: every width, every count around a group, from a buffer of exactly the codes'
// bytes (a load past them would show under the sanitizers).
TEST(BitpackTest, UnpackedCodesAreTheBitsAtEachOffset) {
  std::mt19937 rng(9);
  for (int width = 1; width <= 16; ++width) {
    for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{15}, int64_t{16},
                            int64_t{17}, int64_t{63}, int64_t{1000}, int64_t{4099}}) {
      auto stream = std::make_unique<uint8_t[]>((n * width + 7) / 8);
      for (int64_t b = 0; b < (n * width + 7) / 8; ++b) stream[b] = static_cast<uint8_t>(rng());
      std::vector<uint16_t> codes(n);
      bitpack::unpack_codes(stream.get(), n, width, codes.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(codes[i], code_bits(stream.get(), i, width)) << "width " << width << " n " << n << " element " << i;
      }
    }
  }
}

// pack_code_groups writes each group of eight codes' bits where unpack_codes reads them,
// into a buffer of exactly their bytes, ignoring bits above the width.
TEST(BitpackTest, PackedGroupsHoldEachCodeAtItsOffset) {
  std::mt19937 rng(10);
  for (int width = 1; width <= 16; ++width) {
    for (const int64_t n : {int64_t{0}, int64_t{8}, int64_t{16}, int64_t{64}, int64_t{4096}}) {
      std::vector<uint32_t> codes(n);
      for (auto& code : codes) code = rng();  // bits above the width too
      auto packed = std::make_unique<uint8_t[]>(n * width / 8);
      bitpack::pack_code_groups(codes.data(), n, width, packed.get());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(code_bits(packed.get(), i, width), codes[i] & ((1u << width) - 1))
            << "width " << width << " n " << n << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace gradzip

namespace gradzip {
namespace {

// A payload section as 32-bit words, zero-padded by one word (a code may straddle two).
template <class T>
std::vector<T> section_words(const std::vector<uint8_t>& payload, const wire::Section& section) {
  std::vector<T> words((section.bytes + 3) / 4 + 1, T{});
  std::memcpy(words.data(), payload.data() + section.offset, section.bytes);
  return words;
}

// The one-pass GPU decoders add math::sign_decoded / math::qsgd_decoded per element and
// rank in a register: on the host, the same sums must be the host decoders' bits, for
// every scale (AVG's 1/P included), block or bucket, and code width.
TEST(DecodedTermsTest, AreTheHostDecodersTermsInRankOrder) {
  const int64_t n = 4099;
  for (const char* text : {"sign", "sign:block=100", "sign:block=1024", "sign:vote=majority", "qsgd", "qsgd:bits=3",
                           "qsgd:bits=8", "qsgd:bits=16,bucket=1024", "qsgd:levels=5,bucket=100",
                           "qsgd:norm=max"}) {
    const auto codec = make_codec(parse_spec(text));
    std::vector<std::vector<uint8_t>> payloads(4);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint32_t r = 0; r < 4; ++r) {
      std::vector<float> x(n);
      for (auto& v : x) v = normal(rng);
      codec->encode(x.data(), n, nullptr, {5, 0, r}, payloads[r]);
    }
    for (float scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
      std::vector<float> expected(n, 0.0f);
      for (const auto& p : payloads) codec->decode_add(p.data(), p.size(), expected.data(), n, scale);
      std::vector<float> sum(n, 0.0f);
      for (const auto& p : payloads) {
        wire::Reader reader(p.data(), p.size(), text);
        if (codec->id() == CodecId::kSign) {
          const SignLayout layout = read_sign_layout(reader, n);
          const auto scales = section_words<float>(p, layout.scales);
          const auto bits = section_words<uint32_t>(p, layout.bits);
          for (int64_t i = 0; i < n; ++i) {
            sum[i] += math::sign_decoded(scales.data(), bits.data(), layout.block, scale, i);
          }
        } else {
          const QsgdLayout layout = read_qsgd_layout(reader, n);
          const auto norms = section_words<float>(p, layout.norms);
          const auto codes = section_words<uint32_t>(p, layout.codes);
          for (int64_t i = 0; i < n; ++i) {
            float term = 0.0f;
            ASSERT_TRUE(math::qsgd_decoded(norms.data(), codes.data(), layout.width, layout.levels, layout.bucket,
                                           scale, i, term));
            sum[i] += term;
          }
        }
      }
      ASSERT_EQ(std::memcmp(sum.data(), expected.data(), 4 * n), 0) << text << " scale " << scale;
    }
  }
}

// A level above the payload's levels is refused, as the host decoder refuses it.
TEST(DecodedTermsTest, QsgdRefusesALevelAboveLevels) {
  const float norms[] = {2.0f};
  const uint32_t codes[] = {0x7u | (0x5u << 4), 0};  // 4-bit codes: level 7, then level 5
  float term = -1.0f;
  EXPECT_FALSE(math::qsgd_decoded(norms, codes, 4, 5, 512, 1.0f, 0, term));
  EXPECT_EQ(term, -1.0f);
  ASSERT_TRUE(math::qsgd_decoded(norms, codes, 4, 5, 512, 1.0f, 1, term));
  EXPECT_EQ(term, 2.0f);  // 2 / 5 · 5
}

}  // namespace
}  // namespace gradzip
