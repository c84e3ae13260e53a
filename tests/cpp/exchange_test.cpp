// The exchange's cost model, its choice and its chunks (aggregate/exchange.h); the
// exchanges themselves run with real ranks in tests/python/test_exchange.py.
#include "aggregate/exchange.h"

#include <gtest/gtest.h>

namespace gradzip {
namespace {

std::unique_ptr<Codec> codec(const std::string& spec) { return make_codec(parse_spec(spec)); }

const ExchangeScheme* scheme(const std::string& name) {
  const ExchangeScheme* found = find_exchange_scheme(name);
  EXPECT_NE(found, nullptr) << name;
  return found;
}
const ExchangeScheme* const kAuto = nullptr;   // a request for auto
const ExchangeScheme* const kDense = nullptr;  // the choice of the transport's all-reduce

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
  EXPECT_EQ(cost.of("oneshot"), 3 * slot_bytes(*sign, n));
  EXPECT_EQ(cost.of("twophase"), 2 * 3 * slot_bytes(*sign, n / 4));
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
  EXPECT_EQ(cost.of("twophase"), 2 * 3 * 3 * slot_bytes(*fp16, 84));  // chunks of 250, sub-pieces of 84 at most
  EXPECT_EQ(reduce_scatter_cost(*fp16, 1000, 4, 4, 3).compressed, 3 * 3 * slot_bytes(*fp16, 84));
}

TEST(ExchangeTest, OneShotRoundsFollowWhatARankSends) {
  // A payload of 1.58 MB (sign of 11.9M): three rounds of 512 KiB, at any world size;
  // QSGD 4-bit of 25M (12.7 MB): the most rounds.
  EXPECT_EQ(oneshot_rounds(*codec("sign"), 11'900'000, 2), 3);
  EXPECT_EQ(oneshot_rounds(*codec("sign"), 11'900'000, 8), 3);
  const auto qsgd = codec("qsgd:bits=4");
  EXPECT_EQ(oneshot_rounds(*qsgd, 25'000'000, 2), kMaxRounds);
  // Sparse payloads of 1%, small tensors and one rank: one round, the exchange as it
  // always was.
  EXPECT_EQ(oneshot_rounds(*codec("stc:density=0.01"), 25'000'000, 4), 1);
  EXPECT_EQ(oneshot_rounds(*codec("topk:density=0.01"), 11'900'000, 8), 1);
  EXPECT_EQ(oneshot_rounds(*codec("fp16"), 1 << 12, 8), 1);
  EXPECT_EQ(oneshot_rounds(*qsgd, 25'000'000, 1), 1);
  // Asked for: taken, but never more rounds than elements.
  EXPECT_EQ(oneshot_rounds(*codec("stc:density=0.01"), 1000, 4, 3), 3);
  EXPECT_EQ(oneshot_rounds(*codec("fp16"), 5, 4, 7), 5);
  // The cost counts every round's slot, each of the largest piece.
  EXPECT_EQ(exchange_cost(*qsgd, 25'000'000, 4, 2).of("oneshot"), 8 * slot_bytes(*qsgd, 3'125'000));
  EXPECT_EQ(exchange_cost(*codec("fp16"), 1000, 4, 4, 3).of("oneshot"), 3 * 3 * slot_bytes(*codec("fp16"), 334));
}

TEST(ExchangeTest, PipelinedTwoPhaseWinsNearTiesForCasts) {
  // At 2 ranks two-phase sends one-shot's bytes plus framing; from several rounds on its
  // rounds overlap the codec with the wire, so auto takes it for the casts, whose
  // owners' second encode loses next to nothing, and for no other codec.
  const int64_t n = 25'000'000;
  const ExchangeCost fp16 = exchange_cost(*codec("fp16"), n, 4, 2);
  ASSERT_GT(fp16.rounds, 1);
  EXPECT_EQ(choose_exchange_for(*codec("fp16"), kAuto, fp16), scheme("twophase"));
  const ExchangeCost qsgd = exchange_cost(*codec("qsgd:bits=4"), 4 * n, 4, 2);
  ASSERT_GT(qsgd.rounds, 1);
  EXPECT_EQ(choose_exchange_for(*codec("qsgd:bits=4"), kAuto, qsgd), scheme("oneshot"));
  EXPECT_EQ(choose_exchange_for(*codec("stc:density=0.01"), kAuto,
                                exchange_cost(*codec("stc:density=0.01"), n, 4, 2)),
            scheme("oneshot"));
  // One round (1M fp16 at 2 ranks): nothing to overlap, the fewest bytes.
  EXPECT_EQ(choose_exchange_for(*codec("fp16"), kAuto, exchange_cost(*codec("fp16"), 1 << 20, 4, 2)),
            scheme("oneshot"));
}

TEST(ExchangeTest, AutoPicksTheFewestBytes) {
  const int64_t n = 1 << 20;
  // Dense fp16 payloads: one-shot wins at 2 ranks, two-phase beyond (flat in P).
  EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("fp16"), n, 4, 2)), scheme("oneshot"));
  for (int ranks : {3, 4, 8, 16}) {
    EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("fp16"), n, 4, ranks)),
              scheme("twophase"))
        << ranks;
    EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("qsgd:bits=4"), n, 4, ranks)),
              scheme("twophase"))
        << ranks;
  }
  // Sparse payloads scale with n too, so by bytes alone two-phase wins from 3 ranks up;
  // at 2 ranks one-shot (two-phase pays two slots' framing).
  EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("stc:density=0.001"), n, 4, 2)),
            scheme("oneshot"));
  EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("topk:density=0.01"), n, 4, 2)),
            scheme("oneshot"));
  EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("topk:density=0.01"), n, 4, 4)),
            scheme("twophase"));
  // Compression that moves more than a ring goes dense: identity, and top-k at high
  // density on many ranks; tiny tensors where the headers dominate.
  EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("identity"), n, 4, 4)),
            kDense);
  EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("topk:density=0.5"), n, 4, 8)),
            kDense);
  EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("sign"), 8, 4, 4)), kDense);
  // fp16 tensors: dense moves half as much, so fp16 compression never beats it.
  EXPECT_EQ(choose_exchange(kAuto, exchange_cost(*codec("fp16"), n, 2, 4)), kDense);
  // An explicit request is taken as asked.
  EXPECT_EQ(choose_exchange(scheme("oneshot"), exchange_cost(*codec("identity"), n, 4, 8)),
            scheme("oneshot"));
  EXPECT_EQ(choose_exchange(scheme("twophase"), exchange_cost(*codec("stc:density=0.001"), n, 4, 2)),
            scheme("twophase"));
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
      if (cost.of("oneshot") >= cost.dense) {  // many ranks: two compressions rather than none
        EXPECT_EQ(choose_exchange_for(*lossy, kAuto, cost),
                  cost.of("twophase") < cost.dense ? scheme("twophase") : kDense)
            << spec << ranks;
        continue;
      }
      EXPECT_EQ(choose_exchange_for(*lossy, kAuto, cost), scheme("oneshot")) << spec << ranks;
      EXPECT_EQ(choose_exchange_for(*lossy, scheme("twophase"), cost), scheme("twophase")) << spec;
    }
  }
  for (const char* spec : {"identity", "fp16", "bf16"}) EXPECT_TRUE(codec(spec)->reencodes_losslessly()) << spec;
  EXPECT_EQ(choose_exchange_for(*codec("fp16"), kAuto, exchange_cost(*codec("fp16"), n, 4, 8)),
            scheme("twophase"));
  // QSGD 4-bit at 64 ranks: one-shot would send more than the ring, two-phase less.
  const ExchangeCost many = exchange_cost(*codec("qsgd:bits=4"), n, 4, 64);
  ASSERT_GE(many.of("oneshot"), many.dense);
  EXPECT_EQ(choose_exchange_for(*codec("qsgd:bits=4"), kAuto, many), scheme("twophase"));
}

TEST(ExchangeTest, TwoPhaseBytesPerRankStayFlatInRanks) {
  const auto qsgd = codec("qsgd:bits=4");
  const int64_t n = 1 << 22;
  const double at4 = static_cast<double>(exchange_cost(*qsgd, n, 4, 4).of("twophase"));
  const double at16 = static_cast<double>(exchange_cost(*qsgd, n, 4, 16).of("twophase"));
  EXPECT_LT(at16 / at4, 1.3);
  EXPECT_GT(static_cast<double>(exchange_cost(*qsgd, n, 4, 16).of("oneshot")) / exchange_cost(*qsgd, n, 4, 4).of("oneshot"), 4.9);
}

TEST(ExchangeTest, RequestsAreParsed) {
  EXPECT_EQ(parse_exchange_request("auto"), kAuto);
  for (const ExchangeScheme* s : exchange_schemes()) EXPECT_EQ(parse_exchange_request(s->name), s);
  EXPECT_THROW(parse_exchange_request("ring"), c10::Error);
}

TEST(ExchangeTest, SchemesAreRegisteredOnceWithTheirCost) {
  const auto fp16 = codec("fp16");
  const ExchangeCost cost = exchange_cost(*fp16, 1 << 20, 4, 4);
  ASSERT_EQ(cost.schemes.size(), exchange_schemes().size());
  for (size_t i = 0; i < exchange_schemes().size(); ++i) {
    const ExchangeScheme& s = *exchange_schemes()[i];
    EXPECT_EQ(find_exchange_scheme(s.name), &s);
    EXPECT_EQ(cost.of(s.name), s.bytes(*fp16, 1 << 20, 4, 0)) << s.name;
    EXPECT_EQ(&s.exchange(), &s.exchange()) << s.name;
  }
  EXPECT_EQ(find_exchange_scheme("auto"), nullptr);
  EXPECT_THROW(cost.of("ring"), std::out_of_range);
  // Two-phase compresses twice and runs in the planner's rounds; one-shot neither (its
  // rounds are its own: oneshot_rounds).
  EXPECT_TRUE(scheme("twophase")->compresses_twice && scheme("twophase")->in_rounds);
  EXPECT_FALSE(scheme("oneshot")->compresses_twice || scheme("oneshot")->in_rounds);
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
