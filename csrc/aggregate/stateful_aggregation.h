// StatefulAggregation: an Aggregation that keeps a TensorState per key, behind a mutex,
// and saves and restores all of it (state()/load_state()) or one key's.
#pragma once

#include <map>
#include <mutex>

#include "gradzip/aggregation.h"

namespace gradzip {

class StatefulAggregation : public Aggregation {
 public:
  using Aggregation::Aggregation;

  std::map<std::string, TensorState> state() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return state_;
  }
  void load_state(std::map<std::string, TensorState> state) override {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = std::move(state);
  }
  TensorState tensor_state(const std::string& key) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = state_.find(key);
    return it == state_.end() ? TensorState{} : it->second;
  }
  void set_tensor_state(const std::string& key, TensorState state) override {
    std::lock_guard<std::mutex> lock(mutex_);
    state_[key] = std::move(state);
  }

 protected:
  // Guards state_; an entry's address stays valid while other keys are added.
  mutable std::mutex mutex_;
  std::map<std::string, TensorState> state_;
};

}  // namespace gradzip
