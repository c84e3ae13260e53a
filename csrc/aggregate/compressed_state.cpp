// CompressedState's save and load: one tensor's state as state_dict entries (CPU copies,
// named by state_name(key, field)) and back; load checks each entry's value before
// keeping it (a level within kMaxLevels, a finite loss scale above 0).
#include <c10/util/Exception.h>

#include <cmath>
#include <map>
#include <string>

#include "aggregate/compressed_allreduce.h"

namespace gradzip {

void CompressedState::save(const std::string& key, std::map<std::string, at::Tensor>& out) const {
  if (residual.defined()) out[state_name(key, "residual")] = residual.to(at::kCPU).clone();
  if (velocity.defined()) out[state_name(key, "velocity")] = velocity.to(at::kCPU).clone();
  if (owner_residual.defined()) {
    out[state_name(key, "owner_residual")] = owner_residual.to(at::kCPU).clone();
    out[state_name(key, "owner_offset")] = count_tensor(owner_offset);
  }
  if (level >= 0) out[state_name(key, "level")] = count_tensor(level);
  if (loss_scale != 1.0) out[state_name(key, "loss_scale")] = at::scalar_tensor(loss_scale, at::kDouble);
  if (calls == 0 && step == 0 && level >= 0) return;  // a reduce-scatter piece's level, nothing else
  out[state_name(key, "calls")] = count_tensor(calls);
  out[state_name(key, "step")] = count_tensor(static_cast<int64_t>(step));
}

void CompressedState::load(const std::string& field, const at::Tensor& value, const std::string& name) {
  if (field == "residual") {
    residual = float_state(value, name);
  } else if (field == "velocity") {
    velocity = float_state(value, name);
  } else if (field == "owner_residual") {
    owner_residual = float_state(value, name);
  } else if (field == "owner_offset") {
    owner_offset = count_of(value, name);
  } else if (field == "level") {
    const int64_t value_level = count_of(value, name);
    TORCH_CHECK(value_level < kMaxLevels, "gradzip: state entry '", name, "' holds level ", value_level,
                "; a codec has at most ", kMaxLevels, " levels");
    level = static_cast<int>(value_level);
  } else if (field == "loss_scale") {
    TORCH_CHECK(value.numel() == 1 && value.is_floating_point(), "gradzip: state entry '", name,
                "' must hold one floating-point number");
    loss_scale = value.item<double>();
    TORCH_CHECK(std::isfinite(loss_scale) && loss_scale > 0, "gradzip: state entry '", name,
                "' holds a loss scale of ", loss_scale, "; it must be finite and above 0");
  } else if (field == "calls") {
    calls = count_of(value, name);
  } else if (field == "step") {
    step = static_cast<uint64_t>(count_of(value, name));
  } else {
    unknown_state_field(name);
  }
}

}  // namespace gradzip
