// The zfp codec's prediction of ZFP's decoder (zfp_prediction.h) against the linked
// libzfp's own decoder, bit for bit, and the values it finds outside the bound against
// those the decode leaves there, on fields the self-test does not draw: weights,
// wide exponent ranges, spikes, subnormals, ramps, every partial block, at tolerances
// from far below a block's largest value to far above it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "codec/error_bound.h"
#include "codec/zfp_prediction.h"
#include "codec/zfp_stream.h"

namespace gradzip {
namespace {

std::vector<float> library_decode(std::vector<float> values, double tolerance) {
  const int64_t n = static_cast<int64_t>(values.size());
  ZfpStream encoder(values.data(), n, kZfpAccuracy, tolerance);
  std::vector<uint8_t> stream(encoder.maximum_bytes());
  EXPECT_GT(encoder.compress(stream.data(), stream.size()), 0u);
  std::vector<float> decoded(values.size());
  ZfpStream decoder(decoded.data(), n, kZfpAccuracy, tolerance);
  EXPECT_GT(decoder.decompress(stream.data(), stream.size()), 0u);
  return decoded;
}

TEST(ZfpPrediction, MatchesTheLinkedLibrary) {
  // The codec takes the prediction only where this holds; on Debian's libzfp 1.0 it must.
  EXPECT_TRUE(zfp_prediction_matches_library());
}

TEST(ZfpPrediction, EqualsTheLibrarysDecodeOnFieldsItWasNotTunedOn) {
  std::mt19937 rng(7);
  std::normal_distribution<float> weight(0.0f, 0.02f);
  std::uniform_real_distribution<float> octave(-45.0f, 38.0f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const std::vector<std::pair<std::string, std::function<float(int64_t)>>> fields = {
      {"weights", [&](int64_t) { return weight(rng); }},
      {"wide range", [&](int64_t) { return unit(rng) * std::pow(2.0f, octave(rng)); }},
      {"spikes", [&](int64_t i) { return i % 97 == 0 ? 3e4f * unit(rng) : weight(rng); }},
      {"subnormals", [&](int64_t i) { return std::numeric_limits<float>::denorm_min() * static_cast<float>(i % 1000); }},
      {"ramp", [](int64_t i) { return 1e-3f * static_cast<float>(i) - 4.0f; }},
      {"integers", [&](int64_t) { return static_cast<float>(static_cast<int>(rng() % 2001) - 1000); }},
  };
  int compared = 0, corrected = 0;
  for (const auto& [name, value] : fields) {
    for (const int64_t n : {1, 2, 3, 4, 5, 4098, 40001}) {
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = value(i);
      for (const double tolerance : {1e-9, 3.3e-7, 1e-5, 2e-4, 1e-2, 0.75, 5.0, 1e3, 1e6}) {
        std::vector<float> predicted(n);
        if (!predict_zfp_accuracy_decode(x.data(), n, tolerance, predicted.data())) {
          // Declined only for fields with blocks below 2^-90 and bit planes to keep.
          EXPECT_EQ(name, "subnormals") << "tolerance " << tolerance;
          continue;
        }
        const std::vector<float> decoded = library_decode(x, tolerance);
        ASSERT_EQ(std::memcmp(predicted.data(), decoded.data(), n * sizeof(float)), 0)
            << name << ", n = " << n << ", tolerance " << tolerance;
        // The values the codec corrects: those the library's decode leaves outside.
        std::vector<uint64_t> expected, outside;
        for (int64_t i = 0; i < n; ++i) {
          if (!within_bound(decoded[i], x[i], tolerance)) expected.push_back(static_cast<uint64_t>(i));
        }
        ASSERT_TRUE(zfp_values_outside_bound(x.data(), n, tolerance, outside));
        ASSERT_EQ(outside, expected) << name << ", n = " << n << ", tolerance " << tolerance;
        corrected += static_cast<int>(expected.size());
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 300);
  EXPECT_GT(corrected, 0);  // ZFP leaves some values outside its tolerance here
}

TEST(ZfpPrediction, DeclinesBlocksWhereZfpsScaleOverflows) {
  const std::vector<float> tiny = {1e-30f, -2e-30f, 0.0f, 5e-31f};
  std::vector<float> out(4);
  EXPECT_FALSE(predict_zfp_accuracy_decode(tiny.data(), 4, 1e-38, out.data()));
  // Above such a block's values the tolerance leaves nothing to keep: zeros, predicted.
  EXPECT_TRUE(predict_zfp_accuracy_decode(tiny.data(), 4, 1e-20, out.data()));
  EXPECT_EQ(out, std::vector<float>(4, 0.0f));
}

}  // namespace
}  // namespace gradzip
