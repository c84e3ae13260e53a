// randomk: k = ceil(density·n) entries chosen by (seed, step), the same on every rank,
// so only their values travel; with unbiased=1 they are scaled by n/k.
// Body: u64 k, u64 seed, u64 step, f32 value scale, k fp32 values (ascending index order).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "codec/codec_record.h"
#include "codec/wire.h"

namespace gradzip {

struct RandomKParameters {
  double density = 0.0;   // k = ceil(density·n)
  bool unbiased = false;  // values scaled by n/k
};
// The parameters of a randomk codec (std::logic_error for another codec).
const RandomKParameters& randomk_parameters(const Codec& codec);

// The k distinct indices below n that (seed, step) choose, ascending: Floyd's sampling
// with Philox4x32-10 numbers (on the host; the same on every rank and device). Each
// thread keeps the last draw of at most kKeptRandomKEntries entries, so that the same
// arguments in a row (a decode of P ranks' payloads of one step) draw once, not P times;
// larger draws are not kept (their memory goes with the last holder).
constexpr int64_t kKeptRandomKEntries = int64_t{1} << 23;  // 64 MB of indices
std::shared_ptr<const std::vector<int64_t>> randomk_indices(int64_t n, int64_t k, uint64_t seed, uint64_t step);

struct RandomKLayout {
  uint64_t k, seed, step;
  float value_scale;
  wire::Section values;
  uint64_t bytes;  // the whole payload's
};
// The layout of the payload a randomk codec writes for n elements at (seed, step): what
// the CPU and CUDA writers lay out and the reader checks.
RandomKLayout randomk_layout(int64_t n, const RandomKParameters& p, uint64_t seed, uint64_t step);
// The header and fixed fields of a payload laid out so (both writers).
void write_randomk_fields(wire::Writer& w, int64_t n, const RandomKLayout& layout);
// The one parser of a randomk payload's layout (CPU decoder and CUDA dispatch). Throws PayloadError.
RandomKLayout read_randomk_layout(wire::Reader& r, int64_t n);

const CodecRecord& randomk_record();
extern const DeviceHalf kRandomKDevice;  // cuda/randomk.cu

}  // namespace gradzip
