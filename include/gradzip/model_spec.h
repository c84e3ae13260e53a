// ModelSpec: a whole-model spec (gradzip.codec.compress_model, docs/model-format.md)
// parsed and checked once: a codec spec, bound as every door binds one (BoundSpec), and
// the keys of the model container, which the codec never sees:
//   param_cutoff  float tensors with fewer elements are stored exactly
//   lossless      the stage after the codec on every entry (none, zstd, blosc)
// Their defaults and valid values live in container_keys() alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradzip/bound_spec.h"
#include "gradzip/spec.h"

namespace gradzip {

class ModelSpec {
 public:
  // Throws SpecError naming what is wrong: an unknown key (listing the codec's keys and
  // the container's), a bad value, a name that is no codec.
  explicit ModelSpec(std::string_view text);

  static const std::vector<SpecKey>& container_keys();

  std::string str() const { return spec_.str(); }  // canonical: keys sorted
  // The codec's spec: everything but the container's keys.
  const BoundSpec& codec() const { return codec_; }
  int64_t param_cutoff() const { return param_cutoff_; }
  const std::string& lossless() const { return lossless_; }

  // An error-bounded codec's bound (sz, zfp: their keys mode and bound, defaults filled
  // in); none for other codecs.
  struct ErrorBound {
    bool relative;
    double bound;
  };
  const std::optional<ErrorBound>& error_bound() const { return error_bound_; }
  // The codec's spec with its bound set to `bound`, absolute (error-bounded codecs only).
  BoundSpec with_absolute_bound(double bound) const;

 private:
  Spec spec_;
  BoundSpec codec_;
  int64_t param_cutoff_;
  std::string lossless_;
  std::optional<ErrorBound> error_bound_;
};

}  // namespace gradzip
