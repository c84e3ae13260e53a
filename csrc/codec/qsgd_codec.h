// qsgd (Alistarh et al., 2017): per bucket of d elements with norm ‖v‖ (L2, or max),
// each element becomes sign·‖v‖·ξ/s with ξ in 0..s drawn so that E[ξ] = s·|v_i|/‖v‖:
// unbiased. The random numbers come from Philox4x32-10 keyed by the seed and counted
// by (element, step, rank), one draw per four elements: runs are reproducible and the
// ranks draw independently.
// Body: u8 code width w, u16 levels s, u8 norm (0 L2, 1 max), u32 bucket d,
// ceil(n/d) fp32 norms, then n codes of w bits: level in the low w−1 bits, sign (1 =
// negative) in the top bit.
#pragma once

#include "codec/codec_record.h"
#include "codec/wire.h"

namespace gradzip {

struct QsgdParameters {
  int levels = 0;         // s
  int64_t bucket = 0;     // elements per norm
  bool max_norm = false;  // norm=max (else l2)
};
// The parameters of a qsgd codec (std::logic_error for another codec).
const QsgdParameters& qsgd_parameters(const Codec& codec);

struct QsgdLayout {
  int width;
  uint32_t levels;
  bool max_norm;
  uint32_t bucket;
  uint64_t buckets;
  wire::Section norms, codes;
  uint64_t bytes;  // the whole payload's
};
// The layout of a qsgd payload of n elements: what the CPU and CUDA writers lay out and
// the reader checks.
QsgdLayout qsgd_layout(int64_t n, int levels, bool max_norm, int64_t bucket);
// The header and fixed fields of a payload laid out so (both writers).
void write_qsgd_fields(wire::Writer& w, int64_t n, const QsgdLayout& layout);
// The one parser of a qsgd payload's layout (CPU decoder and CUDA dispatch). Throws PayloadError.
QsgdLayout read_qsgd_layout(wire::Reader& r, int64_t n);

// Bits per code for s levels: enough for 0..s, plus the sign.
int qsgd_code_width(int levels);

const CodecRecord& qsgd_record();
extern const DeviceHalf kQsgdDevice;  // cuda/qsgd.cu

}  // namespace gradzip
