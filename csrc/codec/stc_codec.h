// stc, sparse ternary compression (Sattler et al., 2019): the k = ceil(density·n)
// entries of largest |u| become μ·sign(u_i), μ the mean of their magnitudes.
// Body: u64 k, f32 μ, u8 position coding (0 Golomb-Rice gaps, 1 bitmap), u8 Golomb
// parameter b, u64 position bytes, the positions, then ceil(k/8) bytes of sign bits
// (1 = positive) in position order. Golomb-Rice codes each gap g (zeros between two
// positions) as g >> b one-bits, a zero-bit, then the low b bits of g; the bitmap is
// used when it is smaller (dense selections).
#pragma once

#include "codec/codec_record.h"
#include "codec/wire.h"

namespace gradzip {

constexpr uint8_t kStcGolomb = 0, kStcBitmap = 1;
constexpr int kMaxGolombParameter = 40;

struct StcLayout {
  uint64_t k;
  float mu;
  bool bitmap;
  int golomb_parameter;
  wire::Section positions, signs;
};
// The one parser of an stc payload's layout (CPU decoder and CUDA dispatch). Throws PayloadError.
StcLayout read_stc_layout(wire::Reader& r, int64_t n);

// STC's Golomb-Rice parameter for k positions among n (0 when k = 0 or k = n).
int stc_golomb_parameter(int64_t k, int64_t n);
// The most position bytes a payload of at most max_k positions among n takes (Golomb-Rice
// bound, or the bitmap when smaller).
uint64_t stc_max_position_bytes(int64_t n, int64_t max_k);

const CodecRecord& stc_record();
extern const DeviceHalf kStcDevice;  // cuda/stc_encode.cu

}  // namespace gradzip
