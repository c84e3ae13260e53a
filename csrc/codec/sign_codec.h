// sign: one bit per element (1 = non-negative, so +0 and +NaN vote +1). With block > 0
// (EF-SignSGD, Karimireddy et al. 2019) each block of `block` elements also carries its
// scale ‖u_block‖₁ / |block| and decodes to ±scale; with block = 0 (signSGD, Bernstein
// et al. 2018) it decodes to ±1, for majority vote.
// Body: u32 block, ceil(n/block) fp32 scales (block > 0 only), ceil(n/8) bytes of bits.
#pragma once

#include "codec/codec_record.h"
#include "codec/wire.h"

namespace gradzip {

struct SignParameters {
  int64_t block = 0;      // elements per scale (0: plain signs)
  bool majority = false;  // vote=majority
};
// The parameters of a sign codec (std::logic_error for another codec).
const SignParameters& sign_parameters(const Codec& codec);

struct SignLayout {
  uint32_t block;
  uint64_t blocks;
  wire::Section scales, bits;
  uint64_t bytes;  // the whole payload's
};
// The layout of a sign payload of n elements in blocks of `block`: what the CPU and CUDA
// writers lay out and the reader checks.
SignLayout sign_layout(int64_t n, int64_t block);
// The header and fixed fields of that payload (both writers).
void write_sign_fields(wire::Writer& w, int64_t n, int64_t block);
// The one parser of a sign payload's layout (CPU decoder and CUDA dispatch). Throws PayloadError.
SignLayout read_sign_layout(wire::Reader& r, int64_t n);

const CodecRecord& sign_record();
extern const DeviceHalf kSignDevice;  // cuda/sign.cu

}  // namespace gradzip
