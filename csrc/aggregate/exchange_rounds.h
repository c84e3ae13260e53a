// The round planner: how an exchange cuts an n-element vector into chunks (one per rank)
// and each chunk into the sub-pieces of its rounds, how many rounds it takes, and the
// seed of each piece. Pure arithmetic: every rank computes the same plan from n, the
// ranks and the codec, with nothing exchanged.
#pragma once

#include <cstdint>

#include "gradzip/codec.h"
#include "gradzip/spec.h"

namespace gradzip {

// Chunk j of n elements split over `ranks`: [begin, begin + length), begin = ⌊j·n/ranks⌋.
struct Chunk {
  int64_t begin;
  int64_t length;
};
Chunk exchange_chunk(int64_t n, int ranks, int j);
// The length of the longest chunk: ⌈n/ranks⌉.
int64_t largest_chunk(int64_t n, int ranks);
// The longest sub-piece of any chunk in any of `rounds` rounds.
int64_t largest_piece(int64_t n, int ranks, int rounds);
// Sub-piece `round` of chunk j, in the elements of the whole vector.
Chunk round_piece(int64_t n, int ranks, int j, int rounds, int round);

// The rounds of a two-phase exchange (or a compressed reduce-scatter) of n elements over
// `ranks`: `requested` when it is above 0 (the spec's `rounds` key), else automatic:
// one round per kRoundBytes of what the exchanges sharing a link send over it in the
// first phase (`link_shared_by` exchanges alike: a hierarchical exchange's lanes share
// their node's link), at most kMaxRounds, and at most one per kMinRoundElements of a
// chunk. Never more rounds than elements in the smallest chunk, never fewer than one.
constexpr int64_t kRoundBytes = int64_t{4} << 20;
constexpr int kMaxRounds = 8;
constexpr int64_t kMinRoundElements = 4096;
int exchange_rounds(const Codec& codec, int64_t n, int ranks, int64_t requested = 0, int link_shared_by = 1);
// The rounds of a one-shot exchange of n elements over `ranks`: `requested` when it is
// above 0, else one round per kOneShotRoundBytes of a rank's payload c(n) (one round
// alone), at most kMaxRounds, and at most one per kMinRoundElements. Never more rounds
// than elements, never fewer than one. Finer than two-phase's: at 2 ranks and 1 Gbit/s,
// QSGD 4-bit of 11.9M elements (6 MB) took 119, 87, 69 and 62 ms in 1, 2, 4 and 8
// rounds, and on loopback, where the CPU bounds the call, the same in each within noise
// (docs/results.md "Collectives"). A sparse payload of 1% stays in one round.
constexpr int64_t kOneShotRoundBytes = int64_t{512} << 10;
int oneshot_rounds(const Codec& codec, int64_t n, int ranks, int64_t requested = 0);
// The spec's `rounds` key: 0 (automatic) when it has none.
int64_t rounds_request(const Spec& spec);

// A context of its own for each chunk, phase and round, so that random draws (random-k's
// choice, QSGD's rounding) of different pieces are independent. Round 0 keeps the
// context a one-round exchange always had. Phase 0 encodes this rank's elements from
// `begin` on: the positions it sends are reported (ctx.sent) at their place in the
// whole; phase 1 re-encodes an owner's sum, which reports none.
EncodeContext chunk_context(const EncodeContext& ctx, uint64_t phase, int chunk, int round, int64_t begin);

}  // namespace gradzip
