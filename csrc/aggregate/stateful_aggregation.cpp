#include "aggregate/stateful_aggregation.h"

#include <stdexcept>

namespace gradzip {

std::string state_name(const std::string& key, const std::string& field) { return key + "/" + field; }

std::pair<std::string, std::string> split_state_name(const std::string& name) {
  const auto slash = name.rfind('/');
  if (slash == std::string::npos) {
    throw std::invalid_argument("gradzip: state entry '" + name + "' is not named <key>/<field>");
  }
  return {name.substr(0, slash), name.substr(slash + 1)};
}

at::Tensor count_tensor(int64_t count) { return at::full({1}, count, at::kLong); }

int64_t count_of(const at::Tensor& value, const std::string& name) {
  if (value.numel() != 1 || value.is_floating_point() || value.is_complex()) {
    throw std::invalid_argument("gradzip: state entry '" + name + "' must hold one integer");
  }
  return value.to(at::kCPU, at::kLong).item<int64_t>();
}

at::Tensor float_state(const at::Tensor& value, const std::string& name) {
  if (!value.is_floating_point() || value.dim() != 1) {
    throw std::invalid_argument("gradzip: state entry '" + name + "' must be a 1-D floating tensor, got " +
                                std::string(c10::toString(value.scalar_type())) + " of " +
                                std::to_string(value.dim()) + " dimensions");
  }
  return value.detach().to(at::kCPU, at::kFloat).contiguous().clone();
}

void unknown_state_field(const std::string& name) {
  throw std::invalid_argument("gradzip: state entry '" + name + "' names a field this aggregation does not keep");
}

}  // namespace gradzip
