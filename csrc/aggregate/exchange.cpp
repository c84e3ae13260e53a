#include "aggregate/exchange.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "aggregate/exchange_rounds.h"
#include "gradzip/stats.h"

namespace gradzip {

const char* exchange_name(ExchangeScheme scheme) {
  switch (scheme) {
    case ExchangeScheme::kDense:
      return "dense";
    case ExchangeScheme::kOneShot:
      return "oneshot";
    case ExchangeScheme::kTwoPhase:
      return "twophase";
    case ExchangeScheme::kHierarchical:
      return "hierarchical";
  }
  return "?";
}

ExchangeRequest parse_exchange_request(const std::string& value) {
  if (value == "oneshot") return ExchangeRequest::kOneShot;
  if (value == "twophase") return ExchangeRequest::kTwoPhase;
  TORCH_CHECK(value == "auto", "gradzip: exchange must be auto, oneshot or twophase, got '", value, "'");
  return ExchangeRequest::kAuto;
}

ExchangeRequest exchange_request(const Spec& spec) {
  return parse_exchange_request(spec.get_string("exchange"));
}

Chunk exchange_chunk(int64_t n, int ranks, int j) {
  const auto at = [&](int i) { return static_cast<int64_t>(static_cast<__int128>(n) * i / ranks); };
  return {at(j), at(j + 1) - at(j)};
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

int64_t rounds_request(const Spec& spec) { return spec.get_int("rounds"); }

ExchangeCost exchange_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks, int64_t rounds_requested) {
  const int64_t others = ranks - 1;
  const int rounds = exchange_rounds(codec, n, ranks, rounds_requested);
  return {ring_allreduce_bytes(n * element_bytes, ranks), others * slot_bytes(codec, n),
          2 * others * rounds * slot_bytes(codec, largest_piece(n, ranks, rounds)), rounds};
}

ReduceScatterCost reduce_scatter_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks,
                                      int64_t rounds_requested) {
  const int64_t others = ranks - 1;
  const int rounds = exchange_rounds(codec, n, ranks, rounds_requested);
  return {ranks <= 1 ? 0 : others * (n * element_bytes / ranks),
          others * rounds * slot_bytes(codec, largest_piece(n, ranks, rounds))};
}

const Exchange& exchange_of(ExchangeScheme scheme) {
  TORCH_CHECK(scheme == ExchangeScheme::kOneShot || scheme == ExchangeScheme::kTwoPhase,
              "gradzip: exchange_of takes one-shot or two-phase, not ", exchange_name(scheme));
  return scheme == ExchangeScheme::kTwoPhase ? twophase_exchange() : oneshot_exchange();
}

ExchangeScheme choose_exchange(ExchangeRequest request, const ExchangeCost& cost, bool reencodes_losslessly) {
  if (request == ExchangeRequest::kOneShot) return ExchangeScheme::kOneShot;
  if (request == ExchangeRequest::kTwoPhase) return ExchangeScheme::kTwoPhase;
  if (!reencodes_losslessly) {  // one compression where it saves bytes, else two rather than none
    if (cost.oneshot < cost.dense) return ExchangeScheme::kOneShot;
    return cost.twophase < cost.dense ? ExchangeScheme::kTwoPhase : ExchangeScheme::kDense;
  }
  if (cost.dense <= std::min(cost.oneshot, cost.twophase)) return ExchangeScheme::kDense;
  if (cost.rounds > 1 && cost.twophase <= cost.oneshot + cost.oneshot / 20) return ExchangeScheme::kTwoPhase;
  return cost.oneshot <= cost.twophase ? ExchangeScheme::kOneShot : ExchangeScheme::kTwoPhase;
}

}  // namespace gradzip
