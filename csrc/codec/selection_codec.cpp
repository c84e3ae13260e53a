#include "codec/selection_codec.h"

namespace gradzip {

std::vector<SpecKey> selection_keys() {
  return {SpecKey::number("density", "0.01", 0.0, 1.0, "the share of elements sent: k = ceil(density·n)"),
          SpecKey::boolean("approx", "0", "take the threshold from a 1% sample (k within a few % from 10M up)")};
}

CodecParameters parse_selection(CodecId id, const Spec& spec) {
  CodecParameters p;
  p.id = id;
  p.density = spec.get_double("density", 0.01);
  p.approx = spec.get_bool("approx", false);
  return p;
}

}  // namespace gradzip
