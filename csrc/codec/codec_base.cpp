#include "codec/codec_base.h"

#include <algorithm>
#include <cmath>

namespace gradzip {

void ValueCodec::encode(const float* x, int64_t n, float* residual, const EncodeContext& ctx,
                        std::vector<uint8_t>& out) const {
  const size_t start = out.size();
  if (residual == nullptr) {
    encode_values(x, n, ctx, out);
    return;
  }
  for (int64_t i = 0; i < n; ++i) residual[i] += x[i];  // the residual now holds u = x + e
  encode_values(residual, n, ctx, out);
  decode_add(out.data() + start, out.size() - start, residual, n, -1.0f);  // e = u − sent
}

int64_t count_for_density(double density, int64_t n) {
  const double k = std::ceil(density * static_cast<double>(n));
  return k <= 0 ? 0 : k >= static_cast<double>(n) ? n : static_cast<int64_t>(k);
}

int64_t max_selected(const CodecParameters& parameters, int64_t n) {
  const int64_t k = count_for_density(parameters.density, n);
  return parameters.approx ? std::min(n, 2 * k + 64) : k;
}

}  // namespace gradzip
