// gradzip::polar: the polar transform against an explicit Kronecker power, the frozen-set
// design, and SC (list) encoding of random sources and of codewords.
#include "codec/polar_code.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

namespace gradzip::polar {
namespace {

std::vector<uint8_t> random_bits(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> bits(n);
  for (uint8_t& b : bits) b = rng() & 1;
  return bits;
}

int64_t hamming(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
  return d;
}

// FNV-1a, to pin exact outputs in a few bytes.
uint64_t fingerprint(const std::vector<uint8_t>& bytes) {
  uint64_t h = 14695981039346656037u;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211u;
  return h;
}

// u·F^{⊗m} over GF(2), with F^{⊗m} built entry by entry as G_{k+1} = G_k ⊗ F.
std::vector<uint8_t> kronecker_transform(const std::vector<uint8_t>& u, int m) {
  std::vector<std::vector<uint8_t>> g{{1}};
  const uint8_t f[2][2] = {{1, 0}, {1, 1}};
  for (int k = 0; k < m; ++k) {
    const size_t n = g.size();
    std::vector<std::vector<uint8_t>> next(2 * n, std::vector<uint8_t>(2 * n));
    for (size_t i = 0; i < 2 * n; ++i) {
      for (size_t j = 0; j < 2 * n; ++j) next[i][j] = g[i / 2][j / 2] & f[i % 2][j % 2];
    }
    g.swap(next);
  }
  std::vector<uint8_t> x(u.size(), 0);
  for (size_t i = 0; i < u.size(); ++i) {
    for (size_t j = 0; j < u.size(); ++j) x[j] ^= u[i] & g[i][j];
  }
  return x;
}

// A random codeword: random free bits, decoded.
std::vector<uint8_t> random_codeword(std::mt19937_64& rng, int m, const std::vector<uint8_t>& frozen,
                                     std::vector<uint8_t>& free_bits) {
  free_bits = random_bits(rng, std::count(frozen.begin(), frozen.end(), uint8_t{0}));
  std::vector<uint8_t> x(frozen.size());
  decode(free_bits.data(), m, frozen.data(), x.data());
  return x;
}

TEST(PolarCodeTest, TransformIsTheKroneckerPowerOfF) {
  std::mt19937_64 rng(1);
  for (int m = 1; m <= 6; ++m) {
    const size_t n = size_t{1} << m;
    for (size_t i = 0; i < n; ++i) {  // each row of G_N
      std::vector<uint8_t> u(n, 0);
      u[i] = 1;
      std::vector<uint8_t> x = u;
      transform(x.data(), m);
      EXPECT_EQ(x, kronecker_transform(u, m)) << "m=" << m << " row " << i;
    }
    for (int trial = 0; trial < 10; ++trial) {
      const std::vector<uint8_t> u = random_bits(rng, n);
      std::vector<uint8_t> x = u;
      transform(x.data(), m);
      EXPECT_EQ(x, kronecker_transform(u, m)) << "m=" << m;
    }
  }
}

TEST(PolarCodeTest, TransformIsAnInvolution) {
  std::mt19937_64 rng(2);
  for (int m = 0; m <= 14; ++m) {
    const std::vector<uint8_t> u = random_bits(rng, size_t{1} << m);
    std::vector<uint8_t> x = u;
    transform(x.data(), m);
    transform(x.data(), m);
    EXPECT_EQ(x, u) << "m=" << m;
  }
}

TEST(PolarCodeTest, RateDistortionBoundInvertsTheBinaryEntropy) {
  EXPECT_EQ(rate_distortion_bound(0.0), 0.5);
  EXPECT_EQ(rate_distortion_bound(1.0), 0.0);
  EXPECT_NEAR(rate_distortion_bound(0.5), 0.1100278644, 1e-9);
  for (double rate : {0.01, 0.25, 0.5, 0.75, 0.99}) {
    const double d = rate_distortion_bound(rate);
    EXPECT_NEAR(-d * std::log2(d) - (1 - d) * std::log2(1 - d), 1 - rate, 1e-12) << rate;
  }
}

TEST(PolarCodeTest, FrozenMaskFreezesTheRightCountDeterministically) {
  for (int m : {0, 1, 2, 5, 8, 11}) {
    const int n = 1 << m;
    for (int free_count : {0, 1, n / 4, n / 2, 3 * n / 4, n - 1, n}) {
      if (free_count < 0 || free_count > n) continue;
      const std::vector<uint8_t> mask = frozen_mask(m, free_count);
      ASSERT_EQ(mask.size(), static_cast<size_t>(n));
      EXPECT_EQ(std::count(mask.begin(), mask.end(), uint8_t{1}), n - free_count) << m << " " << free_count;
      EXPECT_EQ(std::count(mask.begin(), mask.end(), uint8_t{0}), free_count);
      EXPECT_EQ(frozen_mask(m, free_count), mask);
      // u_0 sees the worst synthetic channel, u_{N-1} the best.
      if (free_count < n) {
        EXPECT_EQ(mask[0], 1);
      }
      if (free_count > 0) {
        EXPECT_EQ(mask[n - 1], 0);
      }
    }
  }
  // Pinned: any change to the design, or a machine that rounds differently, shows here.
  EXPECT_EQ(fingerprint(frozen_mask(10, 512)), 9616364384074441155u);
  EXPECT_EQ(fingerprint(frozen_mask(12, 1024)), 1162716205400136715u);
}

TEST(PolarCodeTest, RejectsOutOfRangeArguments) {
  EXPECT_THROW(frozen_mask(-1, 0), std::invalid_argument);
  EXPECT_THROW(frozen_mask(kMaxM + 1, 0), std::invalid_argument);
  EXPECT_THROW(frozen_mask(4, 17), std::invalid_argument);
  EXPECT_THROW(frozen_mask(4, -1), std::invalid_argument);
  EXPECT_THROW(Encoder(4, 0), std::invalid_argument);
}

TEST(PolarCodeTest, EncodesRandomSourcesNearTheRateDistortionBound) {
  constexpr int m = 10, n = 1 << m, blocks = 24;
  std::mt19937_64 rng(3);
  for (double rate : {0.25, 0.5, 0.75}) {
    const int free_count = static_cast<int>(rate * n);
    const std::vector<uint8_t> frozen = frozen_mask(m, free_count);
    const double bound = rate_distortion_bound(rate);
    Encoder sc(m), list(m, 4);
    double total[2] = {0, 0};
    for (int b = 0; b < blocks; ++b) {
      const std::vector<uint8_t> y = random_bits(rng, n);
      Encoder* encoders[2] = {&sc, &list};
      for (int e = 0; e < 2; ++e) {
        std::vector<uint8_t> free_bits(free_count), x(n);
        const int64_t distance = encoders[e]->encode(y.data(), frozen.data(), free_bits.data());
        decode(free_bits.data(), m, frozen.data(), x.data());
        ASSERT_EQ(distance, hamming(x, y));
        total[e] += static_cast<double>(distance) / n;
      }
    }
    // Measured at m = 10 over 4096 blocks: 1.08, 1.14 and 1.24 × the bound with SC, less
    // with a list of 4.
    EXPECT_LE(total[0] / blocks, 1.3 * bound) << rate;
    EXPECT_LT(total[1], total[0]) << rate;
  }
}

TEST(PolarCodeTest, EncodingACodewordReproducesIt) {
  std::mt19937_64 rng(4);
  for (int m : {1, 4, 10}) {
    const int n = 1 << m;
    for (int free_count : {n / 4, n / 2, 3 * n / 4, n}) {
      const std::vector<uint8_t> frozen = frozen_mask(m, free_count);
      for (int list_size : {1, 4}) {
        Encoder encoder(m, list_size);
        for (int trial = 0; trial < 4; ++trial) {
          std::vector<uint8_t> free_bits;
          const std::vector<uint8_t> x = random_codeword(rng, m, frozen, free_bits);
          std::vector<uint8_t> encoded(free_count);
          EXPECT_EQ(encoder.encode(x.data(), frozen.data(), encoded.data()), 0);
          EXPECT_EQ(encoded, free_bits) << "m=" << m << " free=" << free_count << " L=" << list_size;
        }
      }
    }
  }
}

TEST(PolarCodeTest, RateZeroSendsNothingAndRateOneEverything) {
  constexpr int m = 6, n = 1 << m;
  std::mt19937_64 rng(5);
  const std::vector<uint8_t> y = random_bits(rng, n);
  const std::vector<uint8_t> all_frozen = frozen_mask(m, 0), none_frozen = frozen_mask(m, n);
  std::vector<uint8_t> free_bits(n), x(n);
  EXPECT_EQ(encode(y.data(), m, all_frozen.data(), free_bits.data()), std::count(y.begin(), y.end(), uint8_t{1}));
  EXPECT_EQ(encode(y.data(), m, none_frozen.data(), free_bits.data()), 0);
  decode(free_bits.data(), m, none_frozen.data(), x.data());
  EXPECT_EQ(x, y);
}

TEST(PolarCodeTest, OneBitBlocks) {
  uint8_t bit = 1;
  transform(&bit, 0);
  EXPECT_EQ(bit, 1);
  EXPECT_EQ(frozen_mask(0, 0), std::vector<uint8_t>{1});
  EXPECT_EQ(frozen_mask(0, 1), std::vector<uint8_t>{0});
  const std::vector<uint8_t> free_mask{0}, frozen{1};
  for (uint8_t y : {0, 1}) {
    uint8_t sent = 7, out = 7;
    EXPECT_EQ(encode(&y, 0, free_mask.data(), &sent), 0);
    EXPECT_EQ(sent, y);
    decode(&sent, 0, free_mask.data(), &out);
    EXPECT_EQ(out, y);
    EXPECT_EQ(encode(&y, 0, frozen.data(), nullptr, 2), y);
    decode(nullptr, 0, frozen.data(), &out);
    EXPECT_EQ(out, 0);
  }
}

TEST(PolarCodeTest, EncoderOutputIsPinned) {
  constexpr int m = 10, n = 1 << m;
  const std::vector<uint8_t> frozen = frozen_mask(m, n / 2);
  std::mt19937_64 rng(6);
  const std::vector<uint8_t> y = random_bits(rng, n);
  std::vector<uint8_t> sc(n / 2), list(n / 2);
  Encoder(m).encode(y.data(), frozen.data(), sc.data());
  Encoder(m, 8).encode(y.data(), frozen.data(), list.data());
  EXPECT_EQ(fingerprint(sc), 10632281457908283027u);
  EXPECT_EQ(fingerprint(list), 10951421277625272261u);
}

}  // namespace
}  // namespace gradzip::polar
