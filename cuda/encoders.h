// GPU encoders that write, into device memory, the same payload bytes as the CPU codecs
// (docs/wire-format.md) for the same input, residual and context. Device pointers
// throughout; everything runs on `stream`. A payload buffer must be 8-byte aligned and
// hold the payload's bytes rounded up to a multiple of 4 (the packers store whole words).
// With a non-null residual, the encoders leave in it exactly what the CPU codec leaves:
// u − what the payload decodes to.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "codec/codec_record.h"
#include "codec/position_coding.h"

namespace gradzip::cuda {

// topk: `count` chosen indices (ascending, from topk_compact) of u; residual is u itself
// (or null), and gets u − u at the chosen entries.
// The payload is laid out by topk_layout() (codec/topk_codec.h).
void write_topk_payload(const float* u, int64_t n, const int64_t* indices, int64_t count, float* residual,
                        uint8_t* payload, cudaStream_t stream);

// stc: first stc_plan() codes the positions' lengths and reads their total back (one
// stream synchronization) to pick Golomb-Rice or the bitmap (the payload is then laid out
// by stc_layout(), codec/stc_codec.h); then write_stc_payload(). Both use the same
// scratch of stc_scratch_bytes(n, count).
struct StcPlan {
  int golomb_parameter = 0;
  uint64_t golomb_bits = 0;
  bool bitmap = false;
  size_t position_bytes = 0;
  PositionCoding coding() const { return {bitmap, golomb_parameter, position_bytes}; }
};
size_t stc_scratch_bytes(int64_t n, int64_t count);
StcPlan stc_plan(int64_t n, const int64_t* indices, int64_t count, void* scratch, cudaStream_t stream);
// The positions section alone (plan.position_bytes at `out`), as write_stc_payload()
// writes it: compact topk codes its positions the same way (codec/position_coding.h).
void write_positions_on_device(const StcPlan& plan, int64_t n, const int64_t* indices, int64_t count, uint8_t* out,
                               void* scratch, cudaStream_t stream);
void write_stc_payload(const StcPlan& plan, const float* u, int64_t n, const int64_t* indices, int64_t count,
                       float* residual, uint8_t* payload, void* scratch, cudaStream_t stream);

// sign: one bit per element by warp ballots, and with block > 0 a scale per block; the
// payload laid out by sign_layout() (codec/sign_codec.h).
void encode_sign(const float* x, float* residual, int64_t n, int64_t block, uint8_t* payload, cudaStream_t stream);

// Device memory for a payload of `size` bytes (DeviceArena::payload): rounded up to 8 (the
// packers store whole words), 8-byte aligned.
uint8_t* payload_memory(DeviceArena& arena, size_t size);

// qsgd: per-bucket norms, then levels drawn with Philox counted by (element, step, rank);
// the payload laid out by qsgd_layout() (codec/qsgd_codec.h).
void encode_qsgd(const float* x, float* residual, int64_t n, int levels, int64_t bucket, bool max_norm,
                 uint64_t seed, uint64_t step, uint32_t rank, uint8_t* payload, cudaStream_t stream);

}  // namespace gradzip::cuda
