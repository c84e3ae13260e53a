// The exchange schemes: one line per scheme. A new scheme is its own file (its Exchange
// and its record, declared in exchange.h) and one line here.
#include "aggregate/exchange.h"

namespace gradzip {

const std::vector<const ExchangeScheme*>& exchange_schemes() {
  static const std::vector<const ExchangeScheme*> schemes = {
      &oneshot_scheme(),
      &twophase_scheme(),
  };
  return schemes;
}

}  // namespace gradzip
