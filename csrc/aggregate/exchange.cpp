#include "aggregate/exchange.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <stdexcept>

#include "gradzip/stats.h"

namespace gradzip {

const ExchangeScheme* find_exchange_scheme(const std::string& name) {
  for (const ExchangeScheme* scheme : exchange_schemes()) {
    if (scheme->name == name) return scheme;
  }
  return nullptr;
}

const ExchangeScheme* parse_exchange_request(const std::string& value) {
  if (value == "auto") return nullptr;
  if (const ExchangeScheme* scheme = find_exchange_scheme(value)) return scheme;
  std::string names = "auto";
  for (const ExchangeScheme* scheme : exchange_schemes()) names += ", " + scheme->name;
  TORCH_CHECK(false, "gradzip: exchange must be one of ", names, ", got '", value, "'");
}

const ExchangeScheme* exchange_request(const Spec& spec) {
  return parse_exchange_request(spec.get_string("exchange"));
}

int64_t ExchangeCost::of(const std::string& name) const {
  const auto& all = exchange_schemes();
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i]->name == name) return schemes.at(i);
  }
  throw std::out_of_range("gradzip: no exchange scheme is named '" + name + "'");
}

ExchangeCost exchange_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks, int64_t rounds_requested) {
  ExchangeCost cost{ring_allreduce_bytes(n * element_bytes, ranks), exchange_rounds(codec, n, ranks, rounds_requested),
                    {}};
  for (const ExchangeScheme* scheme : exchange_schemes()) cost.schemes.push_back(scheme->bytes(codec, n, ranks, rounds_requested));
  return cost;
}

ReduceScatterCost reduce_scatter_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks,
                                      int64_t rounds_requested) {
  const int64_t others = ranks - 1;
  const int rounds = exchange_rounds(codec, n, ranks, rounds_requested);
  return {ranks <= 1 ? 0 : others * (n * element_bytes / ranks),
          others * rounds * slot_bytes(codec, largest_piece(n, ranks, rounds))};
}

namespace {

// The scheme among those `admitted` that sends the fewest bytes, the earlier on a tie
// (within 0.1%: slot framing alone does not decide); null when none is admitted.
template <typename Admitted>
std::pair<const ExchangeScheme*, int64_t> fewest_bytes(const ExchangeCost& cost, Admitted admitted) {
  const auto& all = exchange_schemes();
  std::pair<const ExchangeScheme*, int64_t> best{nullptr, 0};
  for (size_t i = 0; i < all.size(); ++i) {
    if (admitted(*all[i]) && (!best.first || cost.schemes[i] + cost.schemes[i] / 1000 < best.second)) {
      best = {all[i], cost.schemes[i]};
    }
  }
  return best;
}

}  // namespace

const ExchangeScheme* choose_exchange(const ExchangeScheme* request, const ExchangeCost& cost,
                                      bool reencodes_losslessly) {
  if (request) return request;
  if (!reencodes_losslessly) {  // one compression where it saves bytes, else two rather than none
    for (const bool twice : {false, true}) {
      const auto [best, bytes] = fewest_bytes(cost, [&](const ExchangeScheme& s) { return s.compresses_twice == twice; });
      if (best && bytes < cost.dense) return best;
    }
    return nullptr;
  }
  const auto [best, bytes] = fewest_bytes(cost, [](const ExchangeScheme&) { return true; });
  if (!best || cost.dense <= bytes) return nullptr;
  if (cost.rounds > 1 && !best->in_rounds) {
    const auto [pipelined, pipelined_bytes] = fewest_bytes(cost, [](const ExchangeScheme& s) { return s.in_rounds; });
    if (pipelined && pipelined_bytes <= bytes + bytes / 20) return pipelined;
  }
  return best;
}

}  // namespace gradzip
