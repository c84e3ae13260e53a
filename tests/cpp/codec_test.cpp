// Every codec on random inputs: what decodes, error feedback, determinism, and
// refusal of truncated, corrupt and hostile payloads.
#include "gradzip/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <tuple>

#include "codec/codec_base.h"
#include "codec/codec_record.h"
#include "codec/cpu_features.h"
#include "codec/element_math.cuh"
#include "codec/entry_codec.h"
#include "codec/qsgd_codec.h"

namespace gradzip {
namespace {

std::vector<float> random_input(int64_t n, int seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

std::vector<uint8_t> encode(const std::string& spec, const std::vector<float>& x, float* residual = nullptr,
                            EncodeContext ctx = {}) {
  std::vector<uint8_t> out;
  make_codec(parse_spec(spec))->encode(x.data(), static_cast<int64_t>(x.size()), residual, ctx, out);
  return out;
}

std::vector<float> decode(const std::vector<uint8_t>& payload, int64_t n) {
  std::vector<float> out(n, 0.0f);
  codec_for_payload(payload.data(), payload.size())->decode_add(payload.data(), payload.size(), out.data(), n);
  return out;
}

const std::vector<std::string> kSpecs = {
    "identity", "fp16", "bf16", "topk:density=0.01", "topk:density=0.1,approx=1", "topk:density=0.01,values=fp16",
    "topk:density=0.6,values=bf16", "randomk:density=0.05",
    "stc:density=0.01", "stc:density=0.3", "sign", "sign:vote=majority", "sign:block=100",
    "qsgd:bits=4", "qsgd:bits=8,bucket=128", "qsgd:levels=1,norm=max", "qsgd:bits=3,bucket=100",
    "uniform:threshold=0", "uniform", "uniform:bits=5,threshold=10,rounding=nearest",
    "sz", "sz:mode=abs,bound=0.01,predictor=lorenzo", "zfp", "zfp:mode=abs,bound=1e-4",
    "polar", "polar:rate=0.25,block=256,list=2"};

// kSpecs is hand-written (each spec reaches a code path); it must name every registered codec.
TEST(CodecTest, SpecListNamesEveryRegisteredCodec) {
  for (const auto* record : codec_records()) {
    const bool listed = std::any_of(kSpecs.begin(), kSpecs.end(), [&](const std::string& spec) {
      return spec.substr(0, spec.find(':')) == record->name;
    });
    EXPECT_TRUE(listed) << "kSpecs has no spec for " << record->name;
  }
}

TEST(CodecTest, HeaderNamesCodecAndCount) {
  for (const auto& spec : kSpecs) {
    const auto payload = encode(spec, random_input(1000, 1));
    const auto header = read_payload_header(payload.data(), payload.size());
    EXPECT_EQ(header.numel, 1000u) << spec;
    EXPECT_EQ(header.version, kWireVersion);
    EXPECT_EQ(make_codec(parse_spec(spec))->id(), header.codec) << spec;
  }
}

// Exchanges reserve max_payload_bytes(n) per payload: no encode may write more, and
// every codec but STC and compact top-k (Golomb-coded positions), approximate top-k and the
// error-bounded codecs (sz, zfp: entropy-coded)
// writes exactly it.
TEST(CodecTest, PayloadsFitTheirBound) {
  std::vector<float> heavy(4096, 0.0f);  // an approximate threshold meets ties: capped
  for (size_t i = 0; i < heavy.size(); i += 2) heavy[i] = 1.0f;
  for (const auto& spec : kSpecs) {
    const auto codec = make_codec(parse_spec(spec));
    const bool variable = codec->id() == CodecId::kStc || codec->id() == CodecId::kSz || codec->id() == CodecId::kZfp ||
                          spec.find("approx") != std::string::npos ||
                          spec.find("values=") != std::string::npos;
    for (int64_t n : {0, 1, 7, 64, 999, 4096, 100003}) {
      for (int seed = 0; seed < 3; ++seed) {
        auto x = random_input(n, seed, seed == 2 ? 1e-30f : 1.0f);
        std::vector<float> residual(n, 0.5f);
        const auto plain = encode(spec, x);
        const auto with_feedback = encode(spec, x, residual.data(), {7, 1, 2});
        for (const auto* payload : {&plain, &with_feedback}) {
          if (variable) {
            EXPECT_LE(payload->size(), codec->max_payload_bytes(n)) << spec << " n=" << n;
          } else {
            EXPECT_EQ(payload->size(), codec->max_payload_bytes(n)) << spec << " n=" << n;
          }
        }
      }
    }
    EXPECT_LE(encode(spec, heavy).size(), codec->max_payload_bytes(4096)) << spec;
  }
}

// encode_into() (what an exchange calls for its slots) writes the bytes encode() appends
// and leaves the same residual, for every codec, with and without error feedback; a
// codec that writes in place refuses a buffer smaller than its payload.
TEST(CodecTest, EncodeIntoWritesWhatEncodeAppends) {
  for (const auto& spec : kSpecs) {
    const auto codec = make_codec(parse_spec(spec));
    for (int64_t n : {0, 1, 999, 4096}) {
      const auto x = random_input(n, 3);
      std::vector<float> residual(n, 0.25f), residual_into(n, 0.25f);
      for (bool feedback : {false, true}) {
        std::vector<uint8_t> appended;
        codec->encode(x.data(), n, feedback ? residual.data() : nullptr, {5, 2, 1}, appended);
        std::vector<uint8_t> slot(codec->max_payload_bytes(n) + 3, 0xCD);
        const size_t size = codec->encode_into(x.data(), n, feedback ? residual_into.data() : nullptr, {5, 2, 1},
                                               slot.data(), codec->max_payload_bytes(n));
        ASSERT_EQ(size, appended.size()) << spec << " n=" << n;
        EXPECT_TRUE(std::equal(appended.begin(), appended.end(), slot.begin())) << spec << " n=" << n;
        for (size_t i = codec->max_payload_bytes(n); i < slot.size(); ++i) EXPECT_EQ(slot[i], 0xCD) << spec;
        EXPECT_EQ(residual, residual_into) << spec << " n=" << n;
      }
    }
  }
  const auto fp16 = make_codec(parse_spec("fp16"));
  const auto x = random_input(100, 4);
  std::vector<uint8_t> small(fp16->max_payload_bytes(100) - 1);
  EXPECT_THROW(fp16->encode_into(x.data(), 100, nullptr, {}, small.data(), small.size()), std::logic_error);
}

TEST(CodecTest, EncodingIsDeterministic) {
  const auto x = random_input(5000, 2);
  for (const auto& spec : kSpecs) {
    EncodeContext ctx{42, 3, 1};
    EXPECT_EQ(encode(spec, x, nullptr, ctx), encode(spec, x, nullptr, ctx)) << spec;
  }
}

// What an aggregation turns: the same codec at another density or number of levels,
// writing the payload a spec with that value writes; codecs without a knob refuse.
TEST(CodecTest, ABudgetGivesTheCodecOfTheSpecWithThatValue) {
  const auto x = random_input(5000, 4);
  const std::vector<std::tuple<std::string, BudgetKind, double, double, std::string>> knobs = {
      {"topk:density=0.01", BudgetKind::kDensity, 0.01, 0.05, "topk:density=0.05"},
      {"topk:density=0.01,values=fp16", BudgetKind::kDensity, 0.01, 0.2, "topk:density=0.2,values=fp16"},
      {"stc:density=0.01,approx=1", BudgetKind::kDensity, 0.01, 0.5, "stc:density=0.5,approx=1"},
      {"randomk:density=0.05,unbiased=0", BudgetKind::kDensity, 0.05, 0.1, "randomk:density=0.1,unbiased=0"},
      {"qsgd:bits=4,bucket=128", BudgetKind::kLevels, 7, 31, "qsgd:levels=31,bucket=128"}};
  for (const auto& [spec, kind, value, other, other_spec] : knobs) {
    const auto codec = make_codec(parse_spec(spec));
    EXPECT_EQ(codec->budget().kind, kind) << spec;
    EXPECT_EQ(codec->budget().value, value) << spec;
    const auto changed = codec->with_budget(other);
    EXPECT_EQ(changed->budget().value, other) << spec;
    EncodeContext ctx{7, 2, 1};
    std::vector<uint8_t> payload;
    changed->encode(x.data(), static_cast<int64_t>(x.size()), nullptr, ctx, payload);
    EXPECT_EQ(payload, encode(other_spec, x, nullptr, ctx)) << spec << " at " << other;
    EXPECT_THROW(codec->with_budget(kind == BudgetKind::kDensity ? 1.5 : 0.5), std::invalid_argument) << spec;
  }
  for (const std::string spec : {"identity", "fp16", "sign", "uniform", "sz", "polar"}) {
    const auto codec = make_codec(parse_spec(spec));
    EXPECT_EQ(codec->budget().kind, BudgetKind::kNone) << spec;
    EXPECT_THROW(codec->with_budget(0.5), std::invalid_argument) << spec;
  }
  EXPECT_TRUE(make_codec(parse_spec("sign:vote=majority"))->votes());
  EXPECT_FALSE(make_codec(parse_spec("sign"))->votes());
}

TEST(CodecTest, LosslessCodecsRoundTrip) {
  const auto x = random_input(1023, 3);
  const auto identity = decode(encode("identity", x), 1023);
  const auto fp16 = decode(encode("fp16", x), 1023);
  const auto bf16 = decode(encode("bf16", x), 1023);
  for (int i = 0; i < 1023; ++i) {
    ASSERT_EQ(math::float_bits(identity[i]), math::float_bits(x[i]));
    ASSERT_EQ(fp16[i], math::half_to_float(math::float_to_half(x[i])));
    ASSERT_EQ(bf16[i], math::bf16_to_float(math::float_to_bf16(x[i])));
  }
}

TEST(CodecTest, TopKSendsExactlyTheLargest) {
  const int64_t n = 10000;
  const auto x = random_input(n, 4);
  const auto payload = encode("topk:density=0.01", x);
  EXPECT_EQ(payload.size(), kPayloadHeaderBytes + 9 + 100 * 8u);  // 32-bit indices + fp32 values
  const auto decoded = decode(payload, n);
  std::vector<float> magnitudes;
  for (float v : x) magnitudes.push_back(std::fabs(v));
  std::nth_element(magnitudes.begin(), magnitudes.begin() + 99, magnitudes.end(), std::greater<>());
  int sent = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (decoded[i] != 0.0f) {
      ++sent;
      ASSERT_EQ(decoded[i], x[i]);
      ASSERT_GE(std::fabs(x[i]), magnitudes[99]);
    }
  }
  EXPECT_EQ(sent, 100);
}

// values=fp16|bf16: the same positions as fp32 top-k, the values rounded (fp16 saturating
// at ±65504), positions Golomb-coded; error feedback keeps exactly what rounding lost.
TEST(CodecTest, CompactTopKSendsTheLargestRounded) {
  const int64_t n = 10000;
  auto x = random_input(n, 4);
  x[17] = 1e6f;  // beyond fp16's range
  const auto exact = decode(encode("topk:density=0.01", x), n);
  for (const char* spec : {"topk:density=0.01,values=fp16", "topk:density=0.01,values=bf16"}) {
    const bool half = std::string(spec).find("fp16") != std::string::npos;
    std::vector<float> residual(n, 0.0f);
    const auto payload = encode(spec, x, residual.data());
    EXPECT_LT(payload.size(), kPayloadHeaderBytes + 9 + 100 * 8u) << spec;  // fp32 top-k's size
    const auto decoded = decode(payload, n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(decoded[i] != 0.0f, exact[i] != 0.0f) << spec << " " << i;
      if (exact[i] == 0.0f) {
        ASSERT_EQ(residual[i], x[i]);
        continue;
      }
      const float clipped = half ? std::clamp(x[i], -65504.0f, 65504.0f) : x[i];
      const float rounded = half ? math::half_to_float(math::float_to_half(clipped))
                                 : math::bf16_to_float(math::float_to_bf16(clipped));
      ASSERT_EQ(decoded[i], rounded) << spec << " " << i;
      ASSERT_EQ(residual[i], x[i] - rounded) << spec << " " << i;
    }
    EXPECT_EQ(decoded[17], half ? 65504.0f : math::bf16_to_float(math::float_to_bf16(1e6f))) << spec;
  }
}

TEST(CodecTest, TopKWithAtMostKNonZerosIsLossless) {
  std::vector<float> x(1000, 0.0f);
  x[3] = 2.5f;
  x[999] = -1.0f;
  EXPECT_EQ(decode(encode("topk:density=0.01", x), 1000), x);
}

TEST(CodecTest, StcSendsMeanMagnitudeWithSigns) {
  const int64_t n = 20000;
  const auto x = random_input(n, 5);
  for (const char* spec : {"stc:density=0.01", "stc:density=0.5"}) {  // Golomb and bitmap positions
    const auto decoded = decode(encode(spec, x), n);
    const auto topk = decode(encode(std::string("topk") + (spec + 3), x), n);
    double sum = 0;
    int k = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (topk[i] != 0.0f) {
        sum += std::fabs(static_cast<double>(x[i]));
        ++k;
      }
    }
    const float mu = static_cast<float>(sum / k);
    for (int64_t i = 0; i < n; ++i) {
      const float expected = topk[i] == 0.0f ? 0.0f : (x[i] >= 0 ? mu : -mu);
      ASSERT_EQ(decoded[i], expected) << spec << " at " << i;
    }
  }
}

// EncodeContext::chosen: an exact selection codec given the positions it would choose
// writes the payload and residual its own selection gives, and refuses positions that
// are not k ascending ones below n.
TEST(CodecTest, SelectionCodecsTakeTheChosenPositionsTheyWouldChoose) {
  const int64_t n = 5000;
  const auto x = random_input(n, 11);
  const auto old_residual = random_input(n, 12, 0.1f);
  for (const std::string spec : {"topk:density=0.02", "topk:density=0.02,values=bf16", "stc:density=0.02"}) {
    const auto codec = make_codec(parse_spec(spec));
    std::vector<int64_t> sent;
    EncodeContext reporting;
    reporting.sent = &sent;
    std::vector<float> residual = old_residual;
    std::vector<uint8_t> own;
    codec->encode(x.data(), n, residual.data(), reporting, own);
    ASSERT_EQ(static_cast<int64_t>(sent.size()), 100) << spec;
    EncodeContext given;
    given.chosen = &sent;
    std::vector<float> residual_given = old_residual;
    std::vector<uint8_t> payload;
    codec->encode(x.data(), n, residual_given.data(), given, payload);
    EXPECT_EQ(payload, own) << spec;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(math::float_bits(residual_given[i]), math::float_bits(residual[i])) << spec << " at " << i;
    }
    std::vector<int64_t> short_by_one(sent.begin(), sent.end() - 1);
    std::vector<int64_t> descending(sent.rbegin(), sent.rend());
    std::vector<int64_t> outside = sent;
    outside.back() = n;
    for (const auto* bad : {&short_by_one, &descending, &outside}) {
      given.chosen = bad;
      std::vector<float> r = old_residual;
      std::vector<uint8_t> out;
      EXPECT_THROW(codec->encode(x.data(), n, r.data(), given, out), std::invalid_argument) << spec;
    }
  }
}

TEST(CodecTest, StcIsAboutATenthOfABitPerElementAtOnePercent) {
  const int64_t n = 1000000;
  const auto payload = encode("stc:density=0.01", random_input(n, 6));
  const double bits_per_element = 8.0 * payload.size() / n;
  EXPECT_LT(bits_per_element, 0.11) << bits_per_element;  // the paper: about 0.10
  EXPECT_GT(bits_per_element, 0.08);
}

TEST(CodecTest, SignSendsOneBitAndBlockScales) {
  const int64_t n = 1000;
  const auto x = random_input(n, 7);
  const auto plain = decode(encode("sign:vote=majority", x), n);
  const auto scaled = decode(encode("sign:block=100", x), n);
  EXPECT_EQ(encode("sign:vote=majority", x).size(), kPayloadHeaderBytes + 4 + 125);
  for (int64_t b = 0; b < 10; ++b) {
    double l1 = 0;
    for (int64_t i = b * 100; i < (b + 1) * 100; ++i) l1 += std::fabs(static_cast<double>(x[i]));
    const float s = static_cast<float>(l1 / 100);
    for (int64_t i = b * 100; i < (b + 1) * 100; ++i) {
      ASSERT_EQ(plain[i], x[i] >= 0 ? 1.0f : -1.0f);
      ASSERT_NEAR(scaled[i], x[i] >= 0 ? s : -s, 1e-6f * s);  // float lanes, not a float64 sum
      ASSERT_EQ(std::fabs(scaled[i]), std::fabs(scaled[b * 100]));  // one scale per block
    }
  }
}

TEST(CodecTest, RandomKPicksTheSameElementsOnEveryRank) {
  const int64_t n = 5000;
  const auto x = random_input(n, 8);
  const auto a = decode(encode("randomk:density=0.02", x, nullptr, {9, 4, 0}), n);
  const auto b = decode(encode("randomk:density=0.02", x, nullptr, {9, 4, 3}), n);
  const auto c = decode(encode("randomk:density=0.02", x, nullptr, {9, 5, 0}), n);
  EXPECT_EQ(a, b);  // rank does not matter
  EXPECT_NE(a, c);  // the step does
  int chosen = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] != 0.0f) {
      ++chosen;
      ASSERT_FLOAT_EQ(a[i], x[i] * 50.0f);  // unbiased: scaled by n/k
    }
  }
  EXPECT_EQ(chosen, 100);
}

// The entries are drawn once for the same arguments in a row: payloads of other steps,
// seeds, densities and sizes, each encoded and decoded in between, still get entries of
// their own (not the last ones drawn), and the same arguments the same entries again.
TEST(CodecTest, RandomKEntriesFollowEveryArgument) {
  const auto x = random_input(5000, 8);
  const auto entries = [&](const char* spec, int64_t n, EncodeContext ctx, int64_t k) {
    const std::vector<float> head(x.begin(), x.begin() + n);
    const auto decoded = decode(encode(spec, head, nullptr, ctx), n);
    std::vector<int64_t> chosen;
    for (int64_t i = 0; i < n; ++i) {
      if (decoded[i] == 0.0f) continue;
      chosen.push_back(i);
      EXPECT_FLOAT_EQ(decoded[i], head[i] * static_cast<float>(static_cast<double>(n) / k)) << spec << " " << i;
    }
    EXPECT_EQ(static_cast<int64_t>(chosen.size()), k) << spec;
    return chosen;
  };
  std::vector<std::vector<int64_t>> first;
  for (int round = 0; round < 2; ++round) {
    // Each differs from the one before in one argument only (the last: n alone, k = 100).
    const std::vector<std::vector<int64_t>> drawn = {
        entries("randomk:density=0.02", 5000, {9, 4, 0}, 100), entries("randomk:density=0.02", 5000, {9, 5, 0}, 100),
        entries("randomk:density=0.02", 5000, {8, 5, 0}, 100), entries("randomk:density=0.03", 5000, {8, 5, 0}, 150),
        entries("randomk:density=0.02", 5000, {8, 5, 0}, 100), entries("randomk:density=0.025", 4000, {8, 5, 0}, 100)};
    for (size_t a = 0; a < drawn.size(); ++a) {
      for (size_t b = 0; b < a; ++b) {
        if (a != 4 || b != 2) EXPECT_NE(drawn[a], drawn[b]) << a << " " << b;
      }
    }
    EXPECT_EQ(drawn[4], drawn[2]);  // the same arguments again
    if (round == 0) first = drawn;
    if (round == 1) EXPECT_EQ(drawn, first);
  }
}

TEST(CodecTest, QsgdIsUnbiasedWithinItsVarianceBound) {
  const int64_t n = 512;
  const auto x = random_input(n, 9);
  const int draws = 4000;
  for (const char* spec : {"qsgd:bits=4", "qsgd:levels=1,norm=max", "qsgd:bits=2"}) {
    std::vector<double> mean(n, 0.0);
    double squared_error = 0;
    for (int step = 0; step < draws; ++step) {
      const auto q = decode(encode(spec, x, nullptr, {1, static_cast<uint64_t>(step), 0}), n);
      for (int64_t i = 0; i < n; ++i) {
        mean[i] += q[i] / draws;
        squared_error += (q[i] - x[i]) * static_cast<double>(q[i] - x[i]) / draws;
      }
    }
    double norm2 = 0, bias2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      norm2 += x[i] * static_cast<double>(x[i]);
      bias2 += (mean[i] - x[i]) * (mean[i] - x[i]);
    }
    // Unbiased: the mean of `draws` draws is off by the sampling error only, whose
    // expected squared norm is E‖Q − x‖² / draws; allow 3× that.
    EXPECT_LT(bias2, 3.0 * squared_error / draws) << spec;
    if (std::string(spec) == "qsgd:bits=4") {
      // Alistarh et al., Lemma 3.1: E‖Q(v) − v‖² ≤ min(d/s², √d/s)·‖v‖², here s = 7, d = 512.
      EXPECT_LE(squared_error, std::min(512.0 / 49.0, std::sqrt(512.0) / 7.0) * norm2) << spec;
    }
  }
}

TEST(CodecTest, QsgdLevelsAreBoundedByTheNorm) {
  const auto x = random_input(1000, 10);
  const auto q = decode(encode("qsgd:bits=8,bucket=1000,norm=max", x), 1000);
  float max_abs = 0;
  for (float v : x) max_abs = std::max(max_abs, std::fabs(v));
  for (int i = 0; i < 1000; ++i) {
    ASSERT_LE(std::fabs(q[i]), max_abs * 1.0001f);
    ASSERT_LE(std::fabs(q[i] - x[i]), max_abs / 127 * 1.0001f);  // within one level
  }
}

// Every code width (2 to 16 bits), buckets that start mid-byte or not, sizes that end
// mid-group: each element is its code's value as the wire format defines it, whether
// decoded eight lanes at a time or code by code; a level above s is refused either way,
// in the first group of a bucket or after it.
TEST(CodecTest, QsgdDecodeIsEachCodesValueAndRefusesHighLevels) {
  const int64_t n = 5003;
  const auto x = random_input(n, 12);
  for (const std::string spec :
       {"qsgd:levels=1,norm=max", "qsgd:levels=3,bucket=100", "qsgd:levels=5,bucket=33", "qsgd:bits=4",
        "qsgd:levels=15,bucket=64", "qsgd:levels=31,bucket=7", "qsgd:levels=63,bucket=1000", "qsgd:levels=100,bucket=64",
        "qsgd:levels=255,bucket=9", "qsgd:levels=1000", "qsgd:levels=9000,bucket=33", "qsgd:levels=4095,bucket=17", "qsgd:levels=16383",
        "qsgd:bits=16,bucket=100"}) {
    const auto payload = encode(spec, x, nullptr, {3, 1, 0});
    const auto decoded = decode(payload, n);
    const auto codec = make_codec(parse_spec(spec));
    const QsgdParameters& parameters = qsgd_parameters(*codec);
    const int width = qsgd_code_width(parameters.levels);
    const int64_t bucket = parameters.bucket, buckets = (n + bucket - 1) / bucket;
    const size_t codes_at = kPayloadHeaderBytes + 8 + 4 * buckets;
    const auto code_at = [&](const std::vector<uint8_t>& bytes, int64_t i) {
      uint32_t code = 0;
      for (int k = 0; k < width; ++k) {
        const uint64_t bit = static_cast<uint64_t>(i) * width + k;
        code |= static_cast<uint32_t>((bytes[codes_at + bit / 8] >> (bit % 8)) & 1) << k;
      }
      return code;
    };
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t code = code_at(payload, i);
      float norm;
      std::memcpy(&norm, payload.data() + kPayloadHeaderBytes + 8 + 4 * (i / bucket), 4);
      const uint32_t sign = 1u << (width - 1), level = code & (sign - 1);
      const float magnitude = 1.0f * norm / static_cast<float>(parameters.levels) * static_cast<float>(level);
      ASSERT_EQ(decoded[i], (code & sign) ? -magnitude : magnitude) << spec << " element " << i;
    }
    // A level above s: all ones below the sign bit, at an element of the first group
    // (eight lanes), in a later bucket, and in the last, code by code.
    if (parameters.levels == (1 << (width - 1)) - 1) continue;  // every level fits
    for (const int64_t bad : {int64_t{3}, n / 2 + 5, n - 2}) {
      auto broken = payload;
      for (int k = 0; k < width - 1; ++k) {
        const uint64_t bit = static_cast<uint64_t>(bad) * width + k;
        broken[codes_at + bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
      }
      ASSERT_GT(code_at(broken, bad) & ((1u << (width - 1)) - 1), static_cast<uint32_t>(parameters.levels));
      std::vector<float> out(n, 0.0f);
      try {
        codec->decode_add(broken.data(), broken.size(), out.data(), n);
        FAIL() << spec << " element " << bad;
      } catch (const PayloadError& e) {
        EXPECT_NE(std::string(e.what()).find("level"), std::string::npos) << e.what();
      }
    }
  }
}

// The element-wise codecs sum several payloads range by range (add_rows_by_range): the
// bits of decode_add() of each payload in turn, at sizes around the range's length, with
// blocks and buckets that straddle ranges and odd bit offsets; a bad payload is named.
// The row that sum_rows(data, size, on_error) names (its on_error called) over `rows`
// copies of `payload`, row 3's truncated by a byte; −1 if none.
template <class SumRows>
int row_named_for_a_truncated_payload(const std::vector<uint8_t>& payload, int rows, SumRows sum_rows) {
  std::vector<std::vector<uint8_t>> payloads(rows, payload);
  payloads[3].pop_back();
  int named = -1;
  try {
    sum_rows([&](int r) { return payloads[r].data(); }, [&](int r) { return payloads[r].size(); },
             [&](int r, const PayloadError& e) {
               named = r;
               throw e;
             });
  } catch (const PayloadError&) {
  }
  return named;
}

TEST(CodecTest, RowsByRangeAreTheRowsOneAfterAnother) {
  const int rows = 5;
  for (const std::string spec : {"identity", "fp16", "bf16", "sign", "sign:block=100", "sign:block=4096",
                                 "sign:block=0", "qsgd:bits=4", "qsgd:levels=5,bucket=33", "qsgd:bits=3,bucket=100",
                                 "qsgd:bits=8,bucket=5000", "qsgd:levels=100,bucket=7"}) {
    const auto codec = make_codec(parse_spec(spec));
    const auto* elementwise = dynamic_cast<const ElementwiseCodec*>(codec.get());
    ASSERT_NE(elementwise, nullptr) << spec;
    for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, kDecodeRange - 1, kDecodeRange, kDecodeRange + 1,
                            3 * kDecodeRange + 13}) {
      std::vector<std::vector<uint8_t>> payloads;
      for (int r = 0; r < rows; ++r) {
        payloads.push_back(encode(spec, random_input(n, 100 * r + 7, r + 1.0f), nullptr, {1, 0, static_cast<uint32_t>(r)}));
      }
      std::vector<float> one_by_one = random_input(n, 99), by_range = one_by_one;
      for (const auto& payload : payloads) {
        codec->decode_add(payload.data(), payload.size(), one_by_one.data(), n, 0.25f);
      }
      add_rows_by_range(
          *elementwise, rows, [&](int r) { return payloads[r].data(); }, [&](int r) { return payloads[r].size(); },
          by_range.data(), n, 0.25f, [](int r, const PayloadError& e) { FAIL() << r << ": " << e.what(); });
      if (n > 0) ASSERT_EQ(std::memcmp(one_by_one.data(), by_range.data(), 4 * n), 0) << spec << " n " << n;
    }
    std::vector<float> out(100, 0.0f);
    EXPECT_EQ(row_named_for_a_truncated_payload(encode(spec, random_input(100, 3)), rows,
                                                [&](auto data, auto size, auto on_error) {
                                                  add_rows_by_range(*elementwise, rows, data, size, out.data(), 100,
                                                                    1.0f, on_error);
                                                }),
              3)
        << spec;
  }
}

TEST(CodecTest, SumsOfEntriesAreTheRowsAddedIntoZerosOneAfterAnother) {
  const int rows = 4;
  const auto written_over = [](int64_t n) {  // what the sum held before: any bits
    std::vector<float> garbage = random_input(n, 5, 1e30f);
    if (n > 2) garbage[n / 2] = std::numeric_limits<float>::quiet_NaN();
    return garbage;
  };
  // Rows 0 and 2 select the same positions; sizes around the ranges, and one written
  // past the caches (at least kStreamBytes), each at 0..3 floats past an aligned address.
  for (const std::string spec : {"topk:density=0.01", "topk:density=0.3", "topk:density=1",
                                 "topk:density=0.02,values=fp16", "topk:density=0.05,values=bf16",
                                 "stc:density=0.01", "stc:density=0.6"}) {
    const auto codec = make_codec(parse_spec(spec));
    const auto* entries = dynamic_cast<const EntryCodec*>(codec.get());
    ASSERT_NE(entries, nullptr) << spec;
    for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, kDecodeRange - 1, kDecodeRange + 1,
                            3 * kDecodeRange + 13, static_cast<int64_t>(kStreamBytes / 4) + 5}) {
      if (n > kDecodeRange * 4 && spec != "topk:density=0.01" && spec != "stc:density=0.01") continue;
      std::vector<std::vector<uint8_t>> payloads;
      for (int r = 0; r < rows; ++r) {
        payloads.push_back(encode(spec, random_input(n, r == 2 ? 7 : 100 * r + 7, r + 1.0f), nullptr,
                                  {1, 0, static_cast<uint32_t>(r)}));
      }
      std::vector<float> one_by_one(n, 0.0f);
      for (const auto& payload : payloads) {
        codec->decode_add(payload.data(), payload.size(), one_by_one.data(), n, -0.25f);
      }
      for (int64_t skew = 0; skew < 4; ++skew) {
        std::vector<float> buffer(n + 8 + 4);
        float* aligned = buffer.data() + (32 - reinterpret_cast<uintptr_t>(buffer.data()) % 32) % 32 / 4;
        float* out = aligned + skew;
        const std::vector<float> before = written_over(n);
        std::copy(before.begin(), before.end(), out);
        set_rows_by_range(
            *entries, rows, [&](int r) { return payloads[r].data(); }, [&](int r) { return payloads[r].size(); }, out,
            n, -0.25f, [](int r, const PayloadError& e) { FAIL() << r << ": " << e.what(); });
        if (n > 0) ASSERT_EQ(std::memcmp(one_by_one.data(), out, 4 * n), 0) << spec << " n " << n << " skew " << skew;
      }
    }
    const std::vector<float> before = written_over(100);
    std::vector<float> out = before;  // nothing is written
    EXPECT_EQ(row_named_for_a_truncated_payload(encode(spec, random_input(100, 3)), rows,
                                                [&](auto data, auto size, auto on_error) {
                                                  set_rows_by_range(*entries, rows, data, size, out.data(), 100, 1.0f,
                                                                    on_error);
                                                }),
              3)
        << spec;
    EXPECT_EQ(std::memcmp(before.data(), out.data(), 4 * 100), 0) << spec;
  }
}

TEST(CodecTest, ErrorFeedbackKeepsWhatWasNotSent) {
  const int64_t n = 3000;
  for (const auto& spec : kSpecs) {
    std::vector<float> residual = random_input(n, 11, 0.1f);
    const auto x = random_input(n, 12);
    const std::vector<float> old_residual = residual;
    const auto payload = encode(spec, x, residual.data(), {5, 1, 2});
    const auto sent = decode(payload, n);
    for (int64_t i = 0; i < n; ++i) {
      const float u = x[i] + old_residual[i];
      ASSERT_EQ(math::float_bits(residual[i]), math::float_bits(u - sent[i])) << spec << " at " << i;
      if (spec.rfind("topk", 0) == 0) ASSERT_EQ(sent[i] + residual[i], u);  // exact: sent is u or 0
    }
    // The payload compresses u = x + residual, not x.
    std::vector<float> u(n);
    for (int64_t i = 0; i < n; ++i) u[i] = x[i] + old_residual[i];
    EXPECT_EQ(payload, encode(spec, u, nullptr, {5, 1, 2})) << spec;
  }
}

TEST(CodecTest, EmptyAndTinyTensors) {
  for (const auto& spec : kSpecs) {
    for (int64_t n : {0, 1, 3}) {
      const auto x = random_input(n, 13);
      const auto decoded = decode(encode(spec, x), n);
      EXPECT_EQ(decoded.size(), static_cast<size_t>(n)) << spec;
    }
  }
}

TEST(CodecTest, NonFiniteInputsPropagate) {
  std::vector<float> x = random_input(1000, 14);
  x[10] = std::nanf("");
  x[500] = std::numeric_limits<float>::infinity();
  for (const auto& spec : kSpecs) {
    if (spec == "sign:vote=majority" || spec.rfind("randomk", 0) == 0) continue;  // documented exceptions
    if (spec.rfind("sz", 0) == 0 || spec.rfind("zfp", 0) == 0 || spec.rfind("uniform", 0) == 0) {
      try {  // a bound or a min–max range means nothing for them: refused by name
        encode(spec, x);
        ADD_FAILURE() << spec << " took a NaN/Inf input";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("Inf or NaN"), std::string::npos) << e.what();
      }
      continue;
    }
    const auto decoded = decode(encode(spec, x), 1000);
    bool non_finite = false;
    for (float v : decoded) non_finite |= !std::isfinite(v);
    EXPECT_TRUE(non_finite) << spec << " hid a NaN/Inf input";
  }
}

TEST(CodecTest, AllFiniteFindsEveryInfAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {inf, -inf, std::nanf(""), -std::nanf(""), std::bit_cast<float>(0x7F800001u)};
  for (int64_t n : {0, 1, 31, 16383, 16384, 16385, 100003}) {
    auto x = random_input(n, 40, 1e30f);
    if (n > 2) {
      x[1] = std::numeric_limits<float>::max();
      x[2] = std::numeric_limits<float>::denorm_min();
    }
    EXPECT_TRUE(all_finite(x.data(), n)) << n;
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      for (float special : specials) {
        if (n == 0) continue;
        auto y = x;
        y[at] = special;
        EXPECT_FALSE(all_finite(y.data(), n)) << n << " " << at << " " << special;
      }
    }
  }
}

TEST(CodecTest, NonFiniteInputLeavesTheResidualAndDecodesToNaN) {
  const int64_t n = 1000;
  for (const auto& spec : kSpecs) {
    const auto codec = make_codec(parse_spec(spec));
    std::vector<float> residual = random_input(n, 41);
    const auto before = residual;
    auto x = random_input(n, 42);
    x[777] = -std::numeric_limits<float>::infinity();
    std::vector<uint8_t> payload;
    EXPECT_FALSE(encode_unless_non_finite(*codec, x.data(), n, residual.data(), {}, payload)) << spec;
    EXPECT_EQ(0, std::memcmp(before.data(), residual.data(), n * sizeof(float))) << spec;
    ASSERT_EQ(payload.size(), kPayloadHeaderBytes) << spec;
    const PayloadHeader header = read_payload_header(payload.data(), payload.size());
    EXPECT_TRUE(header.non_finite);
    EXPECT_EQ(header.codec, codec->id());
    EXPECT_EQ(header.numel, static_cast<uint64_t>(n));
    std::vector<float> out(n, 1.0f);
    decode_payload_add(payload.data(), payload.size(), out.data(), n);
    for (float v : out) ASSERT_TRUE(std::isnan(v)) << spec;
    EXPECT_THROW(decode_payload_add(payload.data(), payload.size(), out.data(), n + 1), PayloadError);
    EXPECT_THROW(codec->decode_add(payload.data(), payload.size(), out.data(), n), PayloadError) << spec;
    auto with_body = payload;
    with_body.push_back(0);
    EXPECT_THROW(read_payload_header(with_body.data(), with_body.size()), PayloadError);

    // A finite input encodes as before, and decode_payload_add reads it like decode_add.
    x[777] = 0.5f;
    std::vector<uint8_t> finite_payload;
    EXPECT_TRUE(encode_unless_non_finite(*codec, x.data(), n, residual.data(), {}, finite_payload)) << spec;
    std::vector<float> expected(n, 0.0f), got(n, 0.0f);
    codec->decode_add(finite_payload.data(), finite_payload.size(), expected.data(), n);
    decode_payload_add(finite_payload.data(), finite_payload.size(), got.data(), n);
    EXPECT_EQ(expected, got) << spec;
  }
  auto unknown_flag = encode("topk:density=0.1", random_input(100, 43));
  unknown_flag[5] = 1;
  try {
    read_payload_header(unknown_flag.data(), unknown_flag.size());
    FAIL();
  } catch (const PayloadError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown header flags"), std::string::npos) << e.what();
  }
}

TEST(CodecTest, EveryTruncationIsRefused) {
  const auto x = random_input(300, 15);
  for (const auto& spec : kSpecs) {
    const auto payload = encode(spec, x);
    const auto codec = make_codec(parse_spec(spec));
    std::vector<float> out(300);
    for (size_t cut = 0; cut < payload.size(); ++cut) {
      EXPECT_THROW(codec->decode_add(payload.data(), cut, out.data(), 300), PayloadError) << spec << " cut " << cut;
    }
    std::vector<uint8_t> longer = payload;
    longer.push_back(0);
    EXPECT_THROW(codec->decode_add(longer.data(), longer.size(), out.data(), 300), PayloadError) << spec;
  }
}

TEST(CodecTest, WrongCountCodecOrVersionIsRefusedByName) {
  const auto payload = encode("topk:density=0.1", random_input(100, 16));
  std::vector<float> out(101);
  try {
    make_codec(parse_spec("topk"))->decode_add(payload.data(), payload.size(), out.data(), 101);
    FAIL();
  } catch (const PayloadError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 100 elements, the output has 101"), std::string::npos) << e.what();
  }
  try {
    make_codec(parse_spec("stc"))->decode_add(payload.data(), payload.size(), out.data(), 100);
    FAIL();
  } catch (const PayloadError& e) {
    EXPECT_NE(std::string(e.what()).find("a topk payload given to the stc decoder"), std::string::npos) << e.what();
  }
  auto bad_version = payload;
  bad_version[2] = 9;
  EXPECT_THROW(read_payload_header(bad_version.data(), bad_version.size()), PayloadError);
  auto bad_magic = payload;
  bad_magic[0] ^= 1;
  EXPECT_THROW(read_payload_header(bad_magic.data(), bad_magic.size()), PayloadError);
}

// A polar payload's shape (block, free bits) picks the frozen sets its decoder designs (up
// to 60 ms each at 2^16). The payload's own decoder (gradzip.codec.decode's) takes any
// shape; an aggregation's, built from its spec, refuses another before designing anything.
TEST(CodecTest, AnAggregationsPolarDecoderRefusesAnotherShape) {
  const auto x = random_input(5000, 3);
  const auto payload = encode("polar:block=1024", x);
  std::vector<float> out(5000, 0.0f);
  EXPECT_NO_THROW(decode(payload, 5000));
  EXPECT_NO_THROW(make_codec(parse_spec("polar:block=1024"))->decode_add(payload.data(), payload.size(), out.data(), 5000));
  for (const std::string other : {"polar", "polar:block=1024,rate=0.25"}) {
    try {
      make_codec(parse_spec(other))->decode_add(payload.data(), payload.size(), out.data(), 5000);
      FAIL() << other;
    } catch (const PayloadError& e) {
      const std::string want = other == "polar" ? "coded in blocks of 1024 with 512 free bits, not this spec's 4096 with 2048"
                                                : "coded in blocks of 1024 with 512 free bits, not this spec's 1024 with 256";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

TEST(CodecTest, HostileIndicesAreRefusedBeforeAnyWrite) {
  auto payload = encode("topk:density=0.1", random_input(100, 17));
  // The 10 indices start after header (16), k (8) and width (1).
  uint32_t huge = 1000000;
  std::memcpy(payload.data() + 25 + 4 * 5, &huge, 4);
  std::vector<float> out(100, 0.0f);
  EXPECT_THROW(decode(payload, 100), PayloadError);
  const auto codec = make_codec(parse_spec("topk"));
  EXPECT_THROW(codec->decode_add(payload.data(), payload.size(), out.data(), 100), PayloadError);
  EXPECT_EQ(out, std::vector<float>(100, 0.0f));  // nothing written before the check failed
}

TEST(CodecTest, RandomCorruptionNeverWritesOutOfBounds) {
  const int64_t n = 257;
  std::mt19937 rng(18);
  for (const auto& spec : kSpecs) {
    const auto payload = encode(spec, random_input(n, 19));
    for (int trial = 0; trial < 300; ++trial) {
      auto corrupt = payload;
      const int flips = 1 + trial % 4;
      for (int f = 0; f < flips; ++f) corrupt[rng() % corrupt.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      // Guard zones around the output catch a write outside [0, n).
      std::vector<float> guarded(n + 64, 7.0f);
      try {
        codec_for_payload(corrupt.data(), corrupt.size())
            ->decode_add(corrupt.data(), corrupt.size(), guarded.data() + 32, n);
      } catch (const PayloadError&) {
      }
      for (int g = 0; g < 32; ++g) {
        ASSERT_EQ(guarded[g], 7.0f) << spec;
        ASSERT_EQ(guarded[n + 32 + g], 7.0f) << spec;
      }
    }
  }
}

TEST(CodecTest, BadSpecValuesAreRefused) {
  for (const char* spec : {"topk:density=0", "topk:density=1.5", "qsgd:bits=1", "qsgd:bits=4,levels=3",
                           "qsgd:norm=l1", "sign:vote=maybe", "sign:vote=majority,block=8", "qsgd:bucket=0"}) {
    EXPECT_THROW(make_codec(parse_spec(spec)), SpecError) << spec;
  }
  try {
    make_codec(parse_spec("lz4"));
    FAIL();
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("valid codecs: identity, fp16, bf16, topk"), std::string::npos);
  }
}


// uniform writes a zero extreme as +0 whatever the signs of the zeros: the GPU encoder,
// which orders −0 below +0, writes the same bytes.
TEST(CodecTest, UniformWritesZeroExtremesAsPositiveZero) {
  for (const std::vector<float>& x : {std::vector<float>{-0.0f, 0.0f, -0.0f, 0.0f}, std::vector<float>(4, -0.0f),
                                      std::vector<float>{-0.0f, 1.0f, 0.0f, 2.0f},
                                      std::vector<float>{0.0f, -1.0f, -0.0f, -2.0f}}) {
    const auto payload = encode("uniform:threshold=0", x);
    float low, high;
    std::memcpy(&low, payload.data() + kPayloadHeaderBytes + 2, 4);
    std::memcpy(&high, payload.data() + kPayloadHeaderBytes + 6, 4);
    for (const float extreme : {low, high}) {
      if (extreme == 0.0f) EXPECT_FALSE(std::signbit(extreme)) << "a zero extreme written as -0";
    }
    EXPECT_EQ(low, *std::min_element(x.begin(), x.end()));
    EXPECT_EQ(high, *std::max_element(x.begin(), x.end()));
  }
}

}  // namespace
}  // namespace gradzip
