#include "codec/selection_codec.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "codec/stc_codec.h"
#include "codec/topk_codec.h"

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

void check_chosen(const std::vector<int64_t>& chosen, int64_t n, int64_t k) {
  if (static_cast<int64_t>(chosen.size()) != k) {
    throw std::invalid_argument("gradzip: " + std::to_string(chosen.size()) + " positions were chosen for a selection of " +
                                std::to_string(k));
  }
  int64_t previous = -1;
  for (const int64_t i : chosen) {
    if (i <= previous || i >= n) {
      throw std::invalid_argument("gradzip: chosen position " + std::to_string(i) + " is out of [0, " +
                                  std::to_string(n) + ") or not ascending");
    }
    previous = i;
  }
}

const SelectionParameters* exact_selection(const Codec& codec) {
  const SelectionParameters* selection = nullptr;
  if (codec.id() == CodecId::kTopK) selection = &topk_parameters(codec).selection;
  if (codec.id() == CodecId::kStc) selection = &stc_parameters(codec).selection;
  return selection && !selection->approx ? selection : nullptr;
}

}  // namespace gradzip
