// StatefulAggregation: an Aggregation that keeps a KeyState per logical tensor (by the
// caller's key), behind a mutex, and hands it out and takes it back as named tensors,
// "<key>/<field>". A KeyState has
//   void save(const std::string& key, std::map<std::string, at::Tensor>& out) const;
//   void load(const std::string& field, const at::Tensor& value, const std::string& name);
// where load() throws std::invalid_argument for a field it does not know.
#pragma once

#include <map>
#include <mutex>

#include "gradzip/aggregation.h"

namespace gradzip {

std::string state_name(const std::string& key, const std::string& field);
// The key and the field of a state name; throws std::invalid_argument without a '/'.
std::pair<std::string, std::string> split_state_name(const std::string& name);
// A count as a one-element int64 tensor, and back (checked).
at::Tensor count_tensor(int64_t count);
int64_t count_of(const at::Tensor& value, const std::string& name);
// A float32 CPU copy of a state tensor (checked: floating, one dimension).
at::Tensor float_state(const at::Tensor& value, const std::string& name);
[[noreturn]] void unknown_state_field(const std::string& name);

template <typename KeyState>
class StatefulAggregation : public Aggregation {
 public:
  using Aggregation::Aggregation;

  std::map<std::string, at::Tensor> state_dict() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<std::string, at::Tensor> out;
    for (const auto& [key, state] : states_) state.save(key, out);
    return out;
  }
  void forget(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& key : keys) states_.erase(key);
  }
  void load_state_dict(const std::map<std::string, at::Tensor>& state) override {
    std::map<std::string, KeyState> loaded;
    for (const auto& [name, value] : state) {
      const auto [key, field] = split_state_name(name);
      loaded[key].load(field, value, name);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    states_ = std::move(loaded);
  }

 protected:
  // Guards states_; an entry's address stays valid while other keys are added.
  mutable std::mutex mutex_;
  std::map<std::string, KeyState> states_;
};

}  // namespace gradzip
