#include "gradzip/model_spec.h"

#include <cmath>

#include "codec/codec_record.h"
#include "codec/error_bound.h"
#include "codec/lossless.h"

namespace gradzip {
namespace {

const SpecKey* container_key(const std::string& name) {
  for (const auto& key : ModelSpec::container_keys()) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

// The spec without the container's keys (those are checked here).
Spec codec_part_of(const Spec& spec) {
  Spec codec{spec.name, {}};
  for (const auto& [key, value] : spec.params) {
    if (const SpecKey* own = container_key(key)) {
      own->check(spec);
    } else {
      codec.params.emplace(key, value);
    }
  }
  return codec;
}

BoundSpec bind_codec(const Spec& spec, const Spec& codec_part) {
  try {
    BoundSpec bound(codec_part.str());
    if (!bound.codec()) {
      throw SpecError("gradzip: model spec '" + spec.str() + "': '" + spec.name +
                      "' is an aggregation without a codec; a model spec names a codec (sz, zfp, uniform, ...)");
    }
    return bound;
  } catch (const SpecError& e) {
    std::string keys;
    for (const auto& key : ModelSpec::container_keys()) keys += (keys.empty() ? "" : ", ") + key.name;
    throw SpecError(std::string(e.what()) + " (a model spec also takes the container's keys " + keys + ")");
  }
}

}  // namespace

const std::vector<SpecKey>& ModelSpec::container_keys() {
  static const std::vector<SpecKey> keys = {
      SpecKey::integer("param_cutoff", "1024", 0, 9.0e18, "float tensors with fewer elements are stored exactly"),
      SpecKey::choice("lossless", lossless::preferred_method(), lossless::method_names(), "the lossless stage after the codec, on every entry"),
  };
  return keys;
}

ModelSpec::ModelSpec(std::string_view text) : spec_(parse_spec(text)), codec_(bind_codec(spec_, codec_part_of(spec_))) {
  const SpecKey& cutoff = *container_key("param_cutoff");
  const SpecKey& lossless = *container_key("lossless");
  param_cutoff_ = spec_.get_int(cutoff.name, std::stoll(cutoff.default_value));
  lossless_ = spec_.get_string(lossless.name, lossless.default_value);
  const CodecRecord* record = find_codec_record(codec_.codec_spec().name);
  if (record && takes_error_bound(*record)) {
    const ErrorBoundParameters p = parse_error_bound(codec_.codec_spec());
    error_bound_ = ErrorBound{p.relative, p.bound};
  }
}

BoundSpec ModelSpec::with_absolute_bound(double bound) const {
  if (!error_bound_) {
    throw SpecError("gradzip: codec '" + codec_.codec_spec().name + "' takes no error bound");
  }
  if (!(bound > 0.0) || !std::isfinite(bound)) {
    throw SpecError("gradzip: an absolute bound must be a finite number above 0, not " + std::to_string(bound));
  }
  return BoundSpec(gradzip::with_absolute_bound(codec_.spec(), bound).str());
}

}  // namespace gradzip
