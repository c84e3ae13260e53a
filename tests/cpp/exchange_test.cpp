// The exchange's cost model, its choice and its chunks (aggregate/exchange.h); the
// exchanges themselves run with real ranks in tests/python/test_exchange.py.
#include "aggregate/exchange.h"

#include <gtest/gtest.h>

namespace gradzip {
namespace {

std::unique_ptr<Codec> codec(const std::string& spec) { return make_codec(parse_spec(spec)); }

TEST(ExchangeTest, ChunksTileTheTensorEvenly) {
  for (int64_t n : {0, 1, 5, 8, 1000, 1000003}) {
    for (int ranks : {1, 2, 3, 4, 7, 8}) {
      int64_t next = 0;
      for (int j = 0; j < ranks; ++j) {
        const Chunk c = exchange_chunk(n, ranks, j);
        EXPECT_EQ(c.begin, next);
        EXPECT_TRUE(c.length == n / ranks || c.length == n / ranks + 1) << n << " " << ranks << " " << j;
        next += c.length;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(ExchangeTest, CostsCountSlotsPerRank) {
  const auto sign = codec("sign");
  const int64_t n = 1 << 20;
  const ExchangeCost cost = exchange_cost(*sign, n, 4, 4);
  EXPECT_EQ(cost.dense, 2 * 3 * n * 4 / 4);
  EXPECT_EQ(cost.oneshot, 3 * slot_bytes(*sign, n));
  EXPECT_EQ(cost.twophase, 2 * 3 * slot_bytes(*sign, n / 4));
  EXPECT_EQ(slot_bytes(*sign, n), kSlotHeaderBytes + static_cast<int64_t>((sign->max_payload_bytes(n) + 7) / 8 * 8));
}

TEST(ExchangeTest, RoundsFollowTheFirstPhasesBytes) {
  // fp16 at 25M over 4 ranks sends 3 × 12.5 MB in the first phase: the most rounds.
  EXPECT_EQ(exchange_rounds(*codec("fp16"), 25'000'000, 4), kMaxRounds);
  // qsgd 4-bit: 3 × 3.2 MB, two rounds of 4 MiB.
  EXPECT_EQ(exchange_rounds(*codec("qsgd:bits=4"), 25'000'000, 4), 2);
  // Sparse payloads and small tensors: one round, the exchange as it always was.
  EXPECT_EQ(exchange_rounds(*codec("stc:density=0.01"), 25'000'000, 4), 1);
  EXPECT_EQ(exchange_rounds(*codec("fp16"), 1 << 16, 4), 1);
  // Asked for: taken, but never more rounds than the smallest chunk has elements.
  EXPECT_EQ(exchange_rounds(*codec("stc:density=0.01"), 1000, 4, 3), 3);
  EXPECT_EQ(exchange_rounds(*codec("fp16"), 10, 4, 7), 2);
  EXPECT_EQ(exchange_rounds(*codec("fp16"), 3, 4, 7), 1);
  // The cost counts every round's slots.
  const auto fp16 = codec("fp16");
  const ExchangeCost cost = exchange_cost(*fp16, 1000, 4, 4, 3);
  EXPECT_EQ(cost.rounds, 3);
  EXPECT_EQ(cost.twophase, 2 * 3 * 3 * slot_bytes(*fp16, 84));  // chunks of 250, sub-pieces of 84 at most
  EXPECT_EQ(reduce_scatter_cost(*fp16, 1000, 4, 4, 3).compressed, 3 * 3 * slot_bytes(*fp16, 84));
}

TEST(ExchangeTest, PipelinedTwoPhaseWinsNearTiesForCasts) {
  // At 2 ranks two-phase sends one-shot's bytes plus framing; from several rounds on its
  // rounds overlap the codec with the wire, so auto takes it for the casts, whose
  // owners' second encode loses next to nothing, and for no other codec.
  const int64_t n = 25'000'000;
  const ExchangeCost fp16 = exchange_cost(*codec("fp16"), n, 4, 2);
  ASSERT_GT(fp16.rounds, 1);
  EXPECT_EQ(choose_exchange_for(*codec("fp16"), ExchangeRequest::kAuto, fp16), ExchangeScheme::kTwoPhase);
  const ExchangeCost qsgd = exchange_cost(*codec("qsgd:bits=4"), 4 * n, 4, 2);
  ASSERT_GT(qsgd.rounds, 1);
  EXPECT_EQ(choose_exchange_for(*codec("qsgd:bits=4"), ExchangeRequest::kAuto, qsgd), ExchangeScheme::kOneShot);
  EXPECT_EQ(choose_exchange_for(*codec("stc:density=0.01"), ExchangeRequest::kAuto,
                                exchange_cost(*codec("stc:density=0.01"), n, 4, 2)),
            ExchangeScheme::kOneShot);
  // One round (1M fp16 at 2 ranks): nothing to overlap, the fewest bytes.
  EXPECT_EQ(choose_exchange_for(*codec("fp16"), ExchangeRequest::kAuto, exchange_cost(*codec("fp16"), 1 << 20, 4, 2)),
            ExchangeScheme::kOneShot);
}

TEST(ExchangeTest, AutoPicksTheFewestBytes) {
  const int64_t n = 1 << 20;
  // Dense fp16 payloads: one-shot wins at 2 ranks, two-phase beyond (flat in P).
  EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("fp16"), n, 4, 2)), ExchangeScheme::kOneShot);
  for (int ranks : {3, 4, 8, 16}) {
    EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("fp16"), n, 4, ranks)),
              ExchangeScheme::kTwoPhase)
        << ranks;
    EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("qsgd:bits=4"), n, 4, ranks)),
              ExchangeScheme::kTwoPhase)
        << ranks;
  }
  // Sparse payloads scale with n too, so by bytes alone two-phase wins from 3 ranks up;
  // at 2 ranks one-shot (two-phase pays two slots' framing).
  EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("stc:density=0.001"), n, 4, 2)),
            ExchangeScheme::kOneShot);
  EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("topk:density=0.01"), n, 4, 2)),
            ExchangeScheme::kOneShot);
  EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("topk:density=0.01"), n, 4, 4)),
            ExchangeScheme::kTwoPhase);
  // Compression that moves more than a ring goes dense: identity, and top-k at high
  // density on many ranks; tiny tensors where the headers dominate.
  EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("identity"), n, 4, 4)),
            ExchangeScheme::kDense);
  EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("topk:density=0.5"), n, 4, 8)),
            ExchangeScheme::kDense);
  EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("sign"), 8, 4, 4)), ExchangeScheme::kDense);
  // fp16 tensors: dense moves half as much, so fp16 compression never beats it.
  EXPECT_EQ(choose_exchange(ExchangeRequest::kAuto, exchange_cost(*codec("fp16"), n, 2, 4)), ExchangeScheme::kDense);
  // An explicit request is taken as asked.
  EXPECT_EQ(choose_exchange(ExchangeRequest::kOneShot, exchange_cost(*codec("identity"), n, 4, 8)),
            ExchangeScheme::kOneShot);
  EXPECT_EQ(choose_exchange(ExchangeRequest::kTwoPhase, exchange_cost(*codec("stc:density=0.001"), n, 4, 2)),
            ExchangeScheme::kTwoPhase);
}

TEST(ExchangeTest, AutoCompressesLossyCodecsOnce) {
  const int64_t n = 1 << 20;
  // Two-phase's owners would compress the summed chunk again: never auto's choice for a
  // lossy codec, at any number of ranks, with or without error feedback; a selection
  // codec would select again (the codec is the same with or without error feedback).
  for (const char* spec : {"topk:density=0.01", "stc:density=0.01", "randomk:density=0.01",
                           "sign", "qsgd:bits=4", "uniform:threshold=0", "polar:rate=0.5"}) {
    const auto lossy = codec(spec);
    ASSERT_FALSE(lossy->reencodes_losslessly()) << spec;
    for (int ranks : {2, 4, 8, 16, 64}) {
      const ExchangeCost cost = exchange_cost(*lossy, n, 4, ranks);
      if (cost.oneshot >= cost.dense) {  // many ranks: two compressions rather than none
        EXPECT_EQ(choose_exchange_for(*lossy, ExchangeRequest::kAuto, cost),
                  cost.twophase < cost.dense ? ExchangeScheme::kTwoPhase : ExchangeScheme::kDense)
            << spec << ranks;
        continue;
      }
      EXPECT_EQ(choose_exchange_for(*lossy, ExchangeRequest::kAuto, cost), ExchangeScheme::kOneShot) << spec << ranks;
      EXPECT_EQ(choose_exchange_for(*lossy, ExchangeRequest::kTwoPhase, cost), ExchangeScheme::kTwoPhase) << spec;
    }
  }
  for (const char* spec : {"identity", "fp16", "bf16"}) EXPECT_TRUE(codec(spec)->reencodes_losslessly()) << spec;
  EXPECT_EQ(choose_exchange_for(*codec("fp16"), ExchangeRequest::kAuto, exchange_cost(*codec("fp16"), n, 4, 8)),
            ExchangeScheme::kTwoPhase);
  // QSGD 4-bit at 64 ranks: one-shot would send more than the ring, two-phase less.
  const ExchangeCost many = exchange_cost(*codec("qsgd:bits=4"), n, 4, 64);
  ASSERT_GE(many.oneshot, many.dense);
  EXPECT_EQ(choose_exchange_for(*codec("qsgd:bits=4"), ExchangeRequest::kAuto, many), ExchangeScheme::kTwoPhase);
}

TEST(ExchangeTest, TwoPhaseBytesPerRankStayFlatInRanks) {
  const auto qsgd = codec("qsgd:bits=4");
  const int64_t n = 1 << 22;
  const double at4 = static_cast<double>(exchange_cost(*qsgd, n, 4, 4).twophase);
  const double at16 = static_cast<double>(exchange_cost(*qsgd, n, 4, 16).twophase);
  EXPECT_LT(at16 / at4, 1.3);
  EXPECT_GT(static_cast<double>(exchange_cost(*qsgd, n, 4, 16).oneshot) / exchange_cost(*qsgd, n, 4, 4).oneshot, 4.9);
}

TEST(ExchangeTest, RequestsAreParsed) {
  EXPECT_EQ(parse_exchange_request("auto"), ExchangeRequest::kAuto);
  EXPECT_EQ(parse_exchange_request("twophase"), ExchangeRequest::kTwoPhase);
  EXPECT_THROW(parse_exchange_request("ring"), c10::Error);
}

TEST(ExchangeTest, SlotsDeclareTheirSizeAndRefuseLies) {
  std::vector<uint8_t> slot(40, 0xAB);
  const uint8_t payload[5] = {1, 2, 3, 4, 5};
  std::memcpy(slot.data() + kSlotHeaderBytes, payload, 5);
  seal_slot(5, slot.data(), 40);
  uint64_t declared;
  std::memcpy(&declared, slot.data(), 8);
  EXPECT_EQ(declared, 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(slot[kSlotHeaderBytes + i], payload[i]) << i;
  for (size_t i = 13; i < 40; ++i) EXPECT_EQ(slot[i], 0) << i;
  EXPECT_EQ(slot_payload_size(32, 40, 0), 32u);
  EXPECT_THROW(slot_payload_size(33, 40, 1), SlotError);
  try {
    slot_payload_size(kFailedSlot, 40, 3);
    FAIL();
  } catch (const SlotError& e) {
    EXPECT_EQ(e.row(), 3);
    EXPECT_NE(std::string(e.what()).find("could not decode"), std::string::npos);
  }
}

}  // namespace
}  // namespace gradzip
