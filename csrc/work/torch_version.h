// The one place that knows how the torch releases gradzip builds against (2.9 through 2.15)
// differ. Code names the feature it needs, never a release number.
#pragma once

#include <torch/version.h>

#define GRADZIP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10d::Backend::gather_into_tensor, behind dist.gather_single (torch 2.14).
#define GRADZIP_TORCH_HAS_GATHER_INTO_TENSOR GRADZIP_TORCH_AT_LEAST(2, 14)
