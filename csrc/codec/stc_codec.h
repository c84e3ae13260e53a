// stc, sparse ternary compression (Sattler et al., 2019): the k = ceil(density·n)
// entries of largest |u| become μ·sign(u_i), μ the mean of their magnitudes.
// Body: u64 k, f32 μ, the positions (codec/position_coding.h: Golomb-Rice gaps, or a
// bitmap when smaller), then ceil(k/8) bytes of sign bits (1 = positive) in position
// order.
#pragma once

#include "codec/codec_record.h"
#include "codec/position_coding.h"
#include "codec/selection_codec.h"
#include "codec/wire.h"

namespace gradzip {

struct StcParameters {
  SelectionParameters selection;
};
// The parameters of an stc codec (std::logic_error for another codec).
const StcParameters& stc_parameters(const Codec& codec);

struct StcLayout {
  uint64_t k;
  float mu;
  wire::Section mean;  // where mu lies
  PositionLayout positions;
  wire::Section signs;
  uint64_t bytes;  // the whole payload's
};
// The layout of an stc payload of k entries (their mean mu) whose positions are coded
// so: what the CPU and CUDA writers lay out and the reader checks.
StcLayout stc_layout(uint64_t k, float mu, const PositionCoding& positions);
// The header and fixed fields of a payload of n elements laid out so, the position
// header included (both writers).
void write_stc_fields(wire::Writer& w, int64_t n, const StcLayout& layout);
// The one parser of an stc payload's layout (CPU decoder and CUDA dispatch). Throws PayloadError.
StcLayout read_stc_layout(wire::Reader& r, int64_t n);

const CodecRecord& stc_record();
extern const DeviceHalf kStcDevice;  // cuda/stc.cu

}  // namespace gradzip
