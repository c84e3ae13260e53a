// The codecs on CUDA device memory: encode and decode-accumulate through each codec's
// device half (CodecRecord::device, defined in its .cu), producing and reading the same
// payload bytes as the host codecs (gradzip/codec.h). Torch-free: memory comes from a
// DeviceArena (torch's caching allocator in gradzip._C, cudaMalloc in the tests);
// everything runs on the given stream.
//
// Codecs without a device half have_device_half() false: callers use the host codec.
// Stream synchronizations: approximate top-k (its count), stc (its position length),
// decode (the payloads' fixed fields, unless the caller read them, then the device
// checks' verdict).
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "codec/codec_record.h"
#include "codec/device_half.h"

namespace gradzip::cuda {

// A payload that failed to decode, and which one (its position in the list).
class RankPayloadError : public PayloadError {
 public:
  RankPayloadError(int rank, const std::string& what) : PayloadError(what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// Whether the codec, with its parameters, runs on the GPU (else its host codec does).
bool has_device_half(const Codec& codec);

// codec.encode() on the device: x and residual (or null) hold n floats.
DevicePayload device_encode(const Codec& codec, const float* x, int64_t n, float* residual, const EncodeContext& ctx,
                            DeviceArena& arena, cudaStream_t stream);

// The first `bytes` bytes of `count` rows `stride` apart in device memory, copied to the
// host in one copy (one synchronization of `stream`), `bytes` apart.
std::vector<uint8_t> read_row_prefixes(const uint8_t* rows, size_t stride, int count, size_t bytes,
                                       cudaStream_t stream);

// The payload bytes device_decode_add() reads on the host: min(64, stride) of each row.
size_t payload_prefix_bytes(size_t stride);

// Adds scale × payloads r = 0 .. sizes.size() − 1, stored at payloads + r·stride (stride
// a multiple of 8, each row `stride` bytes readable), into out[0..n) (set: into zeros;
// out is then overwritten) in that
// order, as the host decode_add(..., scale) of each would: codecs with a one-pass decode
// (DeviceHalf::queue_decode_rows: sign, qsgd, identity, fp16, bf16) give those bits, in
// one kernel for rows laid out alike and one per row otherwise; the others add each
// payload in turn, into scratch first when scale ≠ 1 (then out + scale × their sum: the
// same bits on every rank, not the host's). Throws
// RankPayloadError for the first invalid payload (checks: decode_accumulate.h).
// `prefixes`: the rows' first payload_prefix_bytes(stride) bytes already on the host,
// `prefix_stride` apart (the caller read them with what else it needed); null: read here.
void device_decode_add(CodecId codec, const uint8_t* payloads, size_t stride, const std::vector<size_t>& sizes,
                       float* out, int64_t n, DeviceArena& arena, cudaStream_t stream, float scale = 1.0f,
                       bool set = false, const uint8_t* prefixes = nullptr, size_t prefix_stride = 0);

// device_decode_add() in parts, so that several decodes share one read of their checks:
// decode_checks() makes `count` cleared check words; queue_decode_add() parses the rows
// (RankPayloadError names a row of this call) and queues their kernels, which set bits
// in errors[r]; check_decoded() reads the words back (one copy, one synchronization) and
// throws RankPayloadError for the first that is set.
int* decode_checks(int count, DeviceArena& arena, cudaStream_t stream);
void queue_decode_add(CodecId codec, const uint8_t* payloads, size_t stride, const std::vector<size_t>& sizes,
                      float* out, int64_t n, DeviceArena& arena, cudaStream_t stream, float scale, bool set,
                      const uint8_t* prefixes, size_t prefix_stride, int* errors);
void check_decoded(CodecId codec, const int* errors, int count, cudaStream_t stream);

}  // namespace gradzip::cuda
