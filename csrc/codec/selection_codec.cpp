#include "codec/selection_codec.h"

#include <algorithm>

namespace gradzip {

SpecKey density_key() {
  return SpecKey::number("density", "0.01", 0.0, 1.0, "the share of elements sent: k = ceil(density·n)");
}

SpecKey density_warmup_key() {
  return SpecKey::integer("density_warmup", "0", 0, 9.2e18,
                          "all-reduces: the first density_warmup compressed calls of each tensor send more, in four "
                          "equal stages of density max(density, 0.25/4^stage): 25%, 6.25%, 1.56%, 0.39% (DGC)");
}

SpecKey momentum_key() {
  return SpecKey::number("momentum", "", 0.0, 0.999,
                         "all-reduces: momentum correction (DGC): compress each tensor's velocity u = m·u + x "
                         "with error feedback, zero u where sent; use an optimizer without momentum (absent: off)");
}

std::vector<SpecKey> selection_keys() {
  return {density_key(), density_warmup_key(), momentum_key(),
          SpecKey::boolean("approx", "0", "take the threshold from a 1% sample (k within a few % from 10M up)")};
}

SelectionParameters parse_selection(const Spec& spec) {
  return {.density = spec.get_double("density"), .approx = spec.get_bool("approx")};
}

int64_t max_selected(const SelectionParameters& selection, int64_t n) {
  const int64_t k = count_for_density(selection.density, n);
  return selection.approx ? std::min(n, 2 * k + 64) : k;
}

}  // namespace gradzip
