#include "c10d/call_sequence_identity.h"

#include <c10/core/ScalarType.h>

#include <utility>

namespace gradzip {

namespace {
constexpr size_t kHistory = 4096;  // calls remembered: periods up to kHistory / 2
}  // namespace

bool CallSequenceIdentity::repeats_without_first(const Signature& signature) const {
  const size_t now = history_.size();
  size_t last = now;
  while (last > 0 && history_[last - 1] != signature) --last;
  if (last == 0) return false;
  const size_t previous = last - 1, period = now - previous;
  if (previous < period) return false;
  for (size_t i = 0; i < period; ++i) {
    if (history_[previous + i] != history_[previous - period + i]) return false;
    if (history_[previous + i] == first_ || history_[previous - period + i] == first_) return false;
  }
  return true;
}

bool CallSequenceIdentity::started_this_step(const at::Tensor& tensor) const {
  return step_storage_ && !step_storage_->expired() &&
         step_storage_->_unsafe_get_target() == tensor.storage().unsafeGetStorageImpl() &&
         step_data_ == tensor.data_ptr();
}

void CallSequenceIdentity::start_step(const at::Tensor& tensor) {
  counts_.clear();
  step_storage_ = tensor.storage().getWeakStorageImpl();
  step_data_ = tensor.data_ptr();
  ++step_;
  for (auto it = named_in_.begin(); it != named_in_.end();) {
    if (it->second < step_ - 2) {
      expired_.push_back(it->first);
      it = named_in_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<std::string> CallSequenceIdentity::take_expired() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(expired_, {});
}

std::string CallSequenceIdentity::key(const at::Tensor& tensor) {
  const Signature signature{static_cast<int>(tensor.scalar_type()), tensor.numel()};
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_) {
    started_ = true;
    first_ = signature;
    start_step(tensor);
  } else if (signature == first_ && (previous_ != first_ || !seen_other_ || started_this_step(tensor))) {
    start_step(tensor);
  } else if (signature != first_ && counts_.count(signature) && repeats_without_first(signature)) {
    first_ = signature;  // the first step's sequence is gone: name the repeating one from here
    seen_other_ = false;
    start_step(tensor);
  }
  if (history_.size() == kHistory) history_.erase(history_.begin(), history_.begin() + kHistory / 2);
  history_.push_back(signature);
  seen_other_ = seen_other_ || signature != first_;
  previous_ = signature;
  const int64_t k = counts_[signature]++;
  std::string key = std::string(c10::toString(tensor.scalar_type())) + ":" + std::to_string(tensor.numel()) + ":" +
                    std::to_string(k);
  named_in_[key] = step_;
  return key;
}

}  // namespace gradzip
