// The piecewise codec (aggregate/piecewise_codec.h) against a simple reference: each
// piece's own top-k by std::nth_element, small pieces exact; and SlotCodec's
// decode_add, on the host and piecewise, against the codec's own decode_add.
#include "aggregate/piecewise_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "aggregate/slots.h"
#include "aggregate/slot_codec.h"

namespace gradzip {
namespace {

std::shared_ptr<const Codec> codec(const std::string& spec) { return make_codec(parse_spec(spec)); }

at::Tensor random_vector(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  at::Tensor x = at::empty({n}, at::kFloat);
  for (int64_t i = 0; i < n; ++i) x[i] = normal(gen);
  return x;
}

// x with only the ceil(density·n) largest magnitudes kept.
at::Tensor reference_topk(const at::Tensor& x, double density) {
  const int64_t n = x.numel();
  const auto k = static_cast<int64_t>(std::ceil(density * static_cast<double>(n)));
  std::vector<float> magnitudes(x.data_ptr<float>(), x.data_ptr<float>() + n);
  for (float& m : magnitudes) m = std::fabs(m);
  std::nth_element(magnitudes.begin(), magnitudes.begin() + (n - k), magnitudes.end());
  const float threshold = magnitudes[n - k];
  return x.abs().ge(threshold).to(at::kFloat) * x;
}

TEST(PiecewiseCodecTest, EachPieceIsSelectedOnItsOwnAndSmallPiecesGoExact) {
  // The middle piece's values are 1000 times smaller: one selection across the tensor
  // would leave it out; piece by piece it gets its own 1%.
  const std::vector<int64_t> sizes = {20000, 5000, 300, 7000};
  const auto topk = codec("topk:density=0.01");
  std::vector<CodecPiece> pieces;
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    pieces.push_back({sizes[i], sizes[i] < kSmallPiece ? codec("identity") : topk});
    parts.push_back(random_vector(sizes[i], static_cast<uint32_t>(i)) * (i == 1 ? 1e-3f : 1.0f));
  }
  const at::Tensor x = at::cat(parts);
  const auto piecewise = piecewise_codec(pieces);
  int64_t bytes = 0;
  for (const auto& piece : pieces) bytes += slot_bytes(*piece.codec, piece.numel);
  ASSERT_EQ(piecewise->slot_bytes(x.numel()), bytes);

  at::Tensor slot = at::empty({bytes}, at::kByte);
  at::Tensor residual = at::zeros_like(x);
  piecewise->encode(x, residual, EncodeContext{}, slot);
  at::Tensor sum = at::empty_like(x);
  piecewise->decode_sum(slot, bytes, 1, sum, 1.0f);
  std::vector<at::Tensor> expected;
  for (size_t i = 0; i < sizes.size(); ++i) {
    expected.push_back(sizes[i] < kSmallPiece ? parts[i] : reference_topk(parts[i], 0.01));
  }
  EXPECT_TRUE(at::equal(sum, at::cat(expected)));
  EXPECT_TRUE(at::equal(residual, x - sum));  // error feedback keeps what was not sent
  EXPECT_GT(sum.narrow(0, 20000, 5000).ne(0).sum().item<int64_t>(), 0);

  // Two rows: decoded in order into each piece, scaled.
  at::Tensor rows = at::cat({slot, slot});
  at::Tensor twice = at::empty_like(x);
  piecewise->decode_sum(rows, bytes, 2, twice, 0.5f);
  EXPECT_TRUE(at::allclose(twice, sum));
}

TEST(PiecewiseCodecTest, APartCutsThePiecesAndKeepsTheirCodecs) {
  const auto topk = codec("topk:density=0.1");
  const auto piecewise = piecewise_codec({{3000, topk}, {500, codec("identity")}, {4000, topk}});
  const auto part = piecewise->part(2000, 3000);  // 1000 of the first, all 500, 1500 of the third
  EXPECT_EQ(part->slot_bytes(3000), slot_bytes(*topk, 1000) + slot_bytes(*codec("identity"), 500) +
                                         slot_bytes(*topk, 1500));
  EXPECT_THROW(piecewise->part(7000, 1000), c10::Error);
  EXPECT_THROW(piecewise->slot_bytes(7499), c10::Error);  // a two-phase chunk would not fit
}

TEST(PiecewiseCodecTest, ASlotDeclaringMoreThanItsPieceHoldsIsRefused) {
  const auto piecewise = piecewise_codec({{2000, codec("topk:density=0.01")}, {2000, codec("topk:density=0.01")}});
  const int64_t bytes = piecewise->slot_bytes(4000);
  at::Tensor slot = at::empty({bytes}, at::kByte);
  piecewise->encode(random_vector(4000, 7), at::Tensor(), EncodeContext{}, slot);
  // The last piece's slot declares a payload that would run past the row.
  const int64_t last = slot_bytes(*codec("topk:density=0.01"), 2000);
  const uint64_t declared = static_cast<uint64_t>(bytes);
  std::memcpy(slot.data_ptr<uint8_t>() + (bytes - last), &declared, sizeof declared);
  at::Tensor sum = at::empty({4000}, at::kFloat);
  try {
    piecewise->decode_sum(slot, bytes, 1, sum, 1.0f);
    FAIL() << "a slot past its piece was decoded";
  } catch (const SlotError& e) {
    EXPECT_EQ(e.row(), 0);
    EXPECT_NE(std::string(e.what()).find("more than the"), std::string::npos) << e.what();
  }
}

// `rows` slots of n random elements encoded by `tensor`, `stride` bytes apart.
at::Tensor encoded_rows(const SlotCodec& tensor, int64_t n, int rows, int64_t stride) {
  at::Tensor slots = at::empty({rows * stride}, at::kByte);
  for (int r = 0; r < rows; ++r) {
    tensor.encode(random_vector(n, 10 + r), at::Tensor(), EncodeContext{5, 1, static_cast<uint32_t>(r)},
                  slots.narrow(0, r * stride, stride));
  }
  return slots;
}

TEST(SlotCodecTest, DecodeAddAddsToWhatTheTargetHolds) {
  // Three rows added into a running state, on the host: the bits of the codec's own
  // decode_add of each payload in turn (qsgd and sign take the range-by-range path).
  const int64_t n = 9000;
  const at::Tensor start = random_vector(n, 3);
  for (const std::string spec : {"qsgd:bits=4", "sign", "topk:density=0.01", "stc:density=0.02"}) {
    const auto host = codec(spec);
    const auto on_host = slot_codec(host, at::kCPU);
    const int64_t stride = on_host->slot_bytes(n);
    const at::Tensor slots = encoded_rows(*on_host, n, 3, stride);
    at::Tensor added = start.clone();
    on_host->decode_add(slots, stride, 3, added, 0.5f);
    at::Tensor expected = start.clone();
    for (int r = 0; r < 3; ++r) {
      uint64_t size;
      std::memcpy(&size, slots.data_ptr<uint8_t>() + r * stride, sizeof size);
      host->decode_add(slots.data_ptr<uint8_t>() + r * stride + kSlotHeaderBytes, size, expected.data_ptr<float>(),
                       n, 0.5f);
    }
    EXPECT_FALSE(at::equal(expected, start)) << spec;
    EXPECT_TRUE(at::equal(added, expected)) << spec;

    // Piecewise: each piece's rows added into its part, as the piece's codec adds them.
    const auto piecewise = piecewise_codec({{6000, host}, {3000, host}});
    const int64_t first = slot_bytes(*host, 6000);
    const int64_t whole = piecewise->slot_bytes(n);
    const at::Tensor pieces = encoded_rows(*piecewise, n, 3, whole);
    at::Tensor by_pieces = start.clone();
    piecewise->decode_add(pieces, whole, 3, by_pieces, 0.5f);
    expected = start.clone();
    on_host->decode_add(pieces, whole, 3, expected.narrow(0, 0, 6000), 0.5f);
    on_host->decode_add(pieces.narrow(0, first, 3 * whole - first), whole, 3, expected.narrow(0, 6000, 3000), 0.5f);
    EXPECT_TRUE(at::equal(by_pieces, expected)) << spec;
  }
}

}  // namespace
}  // namespace gradzip
