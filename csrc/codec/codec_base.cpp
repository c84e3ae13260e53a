#include "codec/codec_base.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace gradzip {

uint64_t seed_for_key(uint64_t seed, std::string_view key) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : key) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  uint64_t z = seed ^ hash;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void report_sent(const EncodeContext& ctx, const std::vector<int64_t>& chosen) {
  if (ctx.sent == nullptr) return;
  ctx.sent->reserve(ctx.sent->size() + chosen.size());
  for (const int64_t i : chosen) ctx.sent->push_back(ctx.sent_offset + i);
}

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

size_t Codec::encode_into(const float* x, int64_t n, float* residual, const EncodeContext& ctx, uint8_t* out,
                          size_t capacity) const {
  thread_local std::vector<uint8_t> payload;
  payload.clear();
  encode(x, n, residual, ctx, payload);
  if (payload.size() > capacity) throw std::logic_error("gradzip: a payload outgrew its codec's max_payload_bytes");
  if (!payload.empty()) std::memcpy(out, payload.data(), payload.size());
  return payload.size();
}

size_t ValueCodec::encode_in_place(const float* x, int64_t n, float* residual, uint8_t* out,
                                   const std::function<size_t(const float* u)>& write) const {
  if (residual == nullptr) return write(x);
  for (int64_t i = 0; i < n; ++i) residual[i] += x[i];  // the residual now holds u = x + e
  const size_t size = write(residual);
  decode_add(out, size, residual, n, -1.0f);  // e = u − sent
  return size;
}

int64_t count_for_density(double density, int64_t n) {
  const double k = std::ceil(density * static_cast<double>(n));
  return k <= 0 ? 0 : k >= static_cast<double>(n) ? n : static_cast<int64_t>(k);
}

double checked_density(const Codec& codec, double density) {
  if (!(density > 0.0 && density <= 1.0)) {
    throw std::invalid_argument("gradzip: " + codec.name() + "'s density must lie in (0, 1], not " +
                                std::to_string(density));
  }
  return density;
}

std::unique_ptr<Codec> Codec::with_budget(double) const {
  throw std::invalid_argument("gradzip: codec '" + name() + "' has no density or levels to set");
}

}  // namespace gradzip
