#include "aggregate/exchange_rounds.h"

#include <algorithm>

#include "aggregate/slots.h"

namespace gradzip {

Chunk exchange_chunk(int64_t n, int ranks, int j) {
  const auto at = [&](int i) { return static_cast<int64_t>(static_cast<__int128>(n) * i / ranks); };
  return {at(j), at(j + 1) - at(j)};
}

int64_t largest_chunk(int64_t n, int ranks) { return exchange_chunk(n, ranks, 0).length + (n % ranks != 0); }

int64_t largest_piece(int64_t n, int ranks, int rounds) { return largest_chunk(largest_chunk(n, ranks), rounds); }

Chunk round_piece(int64_t n, int ranks, int j, int rounds, int round) {
  const Chunk chunk = exchange_chunk(n, ranks, j);
  const Chunk piece = exchange_chunk(chunk.length, rounds, round);
  return {chunk.begin + piece.begin, piece.length};
}

int exchange_rounds(const Codec& codec, int64_t n, int ranks, int64_t requested, int link_shared_by) {
  const int64_t smallest = ranks > 0 ? n / ranks : 0;
  int64_t rounds = requested;
  if (rounds <= 0) {
    const int64_t first_phase = link_shared_by * (ranks - 1) * slot_bytes(codec, largest_chunk(n, ranks));
    rounds = std::min<int64_t>({first_phase / kRoundBytes, kMaxRounds, smallest / kMinRoundElements});
  }
  return static_cast<int>(std::max<int64_t>(1, std::min(rounds, smallest)));
}

int oneshot_rounds(const Codec& codec, int64_t n, int ranks, int64_t requested) {
  int64_t rounds = requested;
  if (rounds <= 0) {
    const int64_t payload = ranks > 1 ? slot_bytes(codec, n) : 0;
    rounds = std::min<int64_t>({payload / kOneShotRoundBytes, kMaxRounds, n / kMinRoundElements});
  }
  return static_cast<int>(std::max<int64_t>(1, std::min(rounds, n)));
}

int64_t rounds_request(const Spec& spec) { return spec.get_int("rounds"); }

EncodeContext chunk_context(const EncodeContext& ctx, uint64_t phase, int chunk, int round, int64_t begin) {
  uint64_t z = ctx.seed + 0x9E3779B97F4A7C15ull * (2 * static_cast<uint64_t>(chunk) + phase + 1) +
               0xD1B54A32D192ED03ull * static_cast<uint64_t>(round);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  EncodeContext of_chunk{z ^ (z >> 31), ctx.step, ctx.rank};
  if (phase == 0) {
    of_chunk.sent = ctx.sent;
    of_chunk.sent_offset = ctx.sent_offset + begin;
  }
  return of_chunk;
}

}  // namespace gradzip
