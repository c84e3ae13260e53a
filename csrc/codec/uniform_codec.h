// uniform: TensorFlow Federated's 8-bit rule for federated averaging (McMahan et al.'s
// FedAvg with TFF's uniform quantization): a tensor of more than `threshold` elements
// (default 10000) is quantized to `bits` bits (default 8) between its min and max, with
// stochastic rounding drawn from (seed, step, rank, element) (rounding=nearest rounds
// instead); smaller tensors travel as fp32. The spec `uniform` alone is TFF's rule.
//
// Body: u8 format (0 quantized, 1 raw floats).
//   raw:       n fp32.
//   quantized: u8 bits, fp32 min, fp32 max, ceil(n × bits / 8) bytes of codes, element i
//              at bit offset i × bits. Code c decodes to min + c × step, step =
//              (max − min) / (2^bits − 1), both in fp64, rounded to fp32 once.
#pragma once

#include "codec/codec_record.h"

namespace gradzip {

const CodecRecord& uniform_record();

}  // namespace gradzip
