#include "c10d/call_sequence_identity.h"

#include <c10/core/ScalarType.h>

namespace gradzip {

std::string CallSequenceIdentity::key(const at::Tensor& tensor) {
  const Signature signature{static_cast<int>(tensor.scalar_type()), tensor.numel()};
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_) {
    started_ = true;
    first_ = signature;
  } else if (signature == first_ && (previous_ != first_ || !seen_other_)) {
    counts_.clear();  // a new step
  }
  seen_other_ = seen_other_ || signature != first_;
  previous_ = signature;
  const int64_t k = counts_[signature]++;
  return std::string(c10::toString(tensor.scalar_type())) + ":" + std::to_string(tensor.numel()) + ":" +
         std::to_string(k);
}

}  // namespace gradzip
