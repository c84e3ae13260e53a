// Position coding against a bit-at-a-time reference: the same bytes written, the same
// positions read, and the same refusals (and messages) for corrupt and truncated streams.
#include "codec/position_coding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <set>
#include <string>

#include "codec/bitpack.h"
#include "gradzip/codec.h"

namespace gradzip {
namespace {

// Golomb-Rice gaps one field at a time: the ones, a zero, the low b bits.
std::vector<uint8_t> reference_golomb(const std::vector<int64_t>& chosen, int b) {
  std::vector<uint8_t> stream;
  bitpack::BitWriter bits(stream);
  int64_t previous = -1;
  for (int64_t i : chosen) {
    const auto gap = static_cast<uint64_t>(i - previous - 1);
    bits.put_ones(gap >> b);
    bits.put(0, 1);
    if (b) bits.put(gap & ((uint64_t{1} << b) - 1), b);
    previous = i;
  }
  bits.flush();
  return stream;
}

// What a reader bit by bit makes of a Golomb stream: the positions, or the refusal's message.
struct Read {
  std::vector<int64_t> positions;
  std::optional<std::string> error;
};

Read reference_read(const std::vector<uint8_t>& stream, int b, uint64_t k, int64_t n) {
  Read read;
  bitpack::BitReader bits(stream.data(), stream.size());
  int64_t at = -1;
  const auto fail = [&](std::string why) {
    read.error = std::move(why);
    read.positions.clear();
    return read;
  };
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t quotient = bits.get_ones();
    if (quotient > static_cast<uint64_t>(n)) return fail("a position gap runs past the tensor");
    const uint64_t gap = (quotient << b) | bits.get(b);
    if (bits.failed()) return fail("the positions end before k = " + std::to_string(k) + " were read");
    if (gap >= static_cast<uint64_t>(n - at - 1)) return fail("position past the last element");
    at += static_cast<int64_t>(gap) + 1;
    read.positions.push_back(at);
  }
  if ((bits.bits_read() + 7) / 8 != stream.size()) return fail("position bytes left over");
  return read;
}

Read read(const std::vector<uint8_t>& stream, bool bitmap, int b, uint64_t k, int64_t n) {
  wire::Reader reader(stream.data(), stream.size(), "positions");
  const PositionLayout layout{bitmap, b, {0, stream.size()}};
  Read got;
  try {
    got.positions.resize(k);
    read_positions(reader, layout, k, n, got.positions.data());
  } catch (const PayloadError& e) {
    const std::string what = e.what();
    got.error = what.substr(what.rfind(": ") + 2);  // the reason, after the payload's name
    got.positions.clear();
  }
  return got;
}

std::vector<int64_t> random_positions(std::mt19937_64& rng, int64_t n, int64_t k, bool clustered) {
  std::set<int64_t> chosen;
  if (clustered) chosen.insert(static_cast<int64_t>(rng() % 7));  // one early, the rest at the end: a long run
  while (static_cast<int64_t>(chosen.size()) < k) {
    chosen.insert(clustered ? n - 1 - static_cast<int64_t>(rng() % static_cast<uint64_t>(4 * k))
                            : static_cast<int64_t>(rng() % static_cast<uint64_t>(n)));
  }
  return {chosen.begin(), chosen.end()};
}

// (n, k): a bitmap (half the elements), and Golomb parameters 1, 6, 9 and the largest, 40
// (k = 1 or 5 among 2^44).
const std::vector<std::pair<int64_t, int64_t>> kSizes = {
    {64, 32}, {1000, 300}, {4099, 41}, {100003, 1000}, {100003, 100}, {1 << 20, 1049}, {int64_t{1} << 44, 1}, {int64_t{1} << 44, 5}};

TEST(PositionCodingTest, WritesTheReferenceBytesAndReadsThemBack) {
  std::mt19937_64 rng(3);
  for (const auto& [n, k] : kSizes) {
    for (bool clustered : {false, true}) {
      const std::vector<int64_t> chosen = random_positions(rng, n, k, clustered && 4 * k + 8 < n);
      const CodedPositions coded = code_positions(chosen, n);
      const int b = golomb_parameter(k, n);
      EXPECT_EQ(coded.coding.golomb_parameter, b);
      if (!coded.coding.bitmap) {
        EXPECT_EQ(coded.bytes, reference_golomb(chosen, b)) << "n=" << n << " k=" << k;
      }
      const Read got = read(coded.bytes, coded.coding.bitmap, b, chosen.size(), n);
      EXPECT_FALSE(got.error) << *got.error;
      EXPECT_EQ(got.positions, chosen) << "n=" << n << " k=" << k << " clustered=" << clustered;
    }
  }
}

TEST(PositionCodingTest, RefusesCorruptStreamsAsTheReferenceDoes) {
  std::mt19937_64 rng(11);
  for (const auto& [n, k] : kSizes) {
    const int b = golomb_parameter(k, n);
    const std::vector<int64_t> chosen = random_positions(rng, n, k, false);
    const std::vector<uint8_t> good = reference_golomb(chosen, b);
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<uint8_t> bad = good;
      switch (trial % 4) {
        case 0:  // a flipped bit
          bad[rng() % bad.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:  // cut short
          bad.resize(rng() % bad.size());
          break;
        case 2:  // a run of one-bits
          std::fill(bad.begin() + static_cast<int64_t>(rng() % bad.size()), bad.end(), uint8_t{0xff});
          break;
        default:  // a byte too many
          bad.push_back(static_cast<uint8_t>(rng()));
      }
      const Read want = reference_read(bad, b, k, n);
      const Read got = read(bad, false, b, k, n);
      ASSERT_EQ(got.error, want.error) << "n=" << n << " k=" << k << " trial " << trial;
      ASSERT_EQ(got.positions, want.positions) << "n=" << n << " k=" << k << " trial " << trial;
    }
  }
}

TEST(PositionCodingTest, ABitmapMarksExactlyKPositions) {
  const int64_t n = 21;  // 3 bytes, the last with 3 bits of padding
  std::vector<uint8_t> bitmap = {0b00000101, 0, 0b00010000};
  EXPECT_EQ(read(bitmap, true, 0, 3, n).positions, (std::vector<int64_t>{0, 2, 20}));
  EXPECT_EQ(read(bitmap, true, 0, 2, n).error, "the bitmap marks 3 positions, k is 2");
  EXPECT_EQ(read(bitmap, true, 0, 4, n).error, "the bitmap marks 3 positions, k is 4");
  bitmap[2] |= 0b11100000;  // padding past the tensor is not a position
  EXPECT_EQ(read(bitmap, true, 0, 3, n).positions, (std::vector<int64_t>{0, 2, 20}));
}

}  // namespace
}  // namespace gradzip
