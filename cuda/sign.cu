// sign payload on the GPU: block scales (eight threads per block in the CPU's lane
// order, block_lanes.cuh), the bits by warp ballots, 32 elements to a word, and the
// residual update u − (±scale), as the CPU codec leaves it. One pass when the block is a
// multiple of 32 up to 1024 elements (the default 512); two otherwise.
#include <tuple>

#include "codec/wire.h"
#include "codec/block_lanes.cuh"
#include "cuda_check.h"
#include "codec/element_math.cuh"
#include "payload_memory.cuh"
#include "codec/sign_codec.h"
#include "decode_accumulate.h"
#include "payload_rows.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

// One scale per block of `block` elements: ‖u_block‖₁ / length; with `x`, makes
// u = residual + x in place first (the lanes own disjoint elements).
__global__ void __launch_bounds__(kThreads)
    sign_scales(const float* x, float* residual, int64_t n, int64_t block, int64_t blocks, float* scales) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t b = t / kLanes;
  const int lane = static_cast<int>(t % kLanes);
  const bool valid = b < blocks;
  const int64_t begin = b * block;
  const int64_t length = valid ? (n - begin < block ? n - begin : block) : 0;
  if (valid && x) {
    const int64_t full = length / kLanes * kLanes;
    for (int64_t i = lane; i < full; i += kLanes) residual[begin + i] = residual[begin + i] + x[begin + i];
    if (lane == 0) {
      for (int64_t i = full; i < length; ++i) residual[begin + i] = residual[begin + i] + x[begin + i];
    }
  }
  const float* u = residual;
  const float lane_value =
      lane_sum(u + (valid ? begin : 0), length, lane, valid, [](float v) { return fabsf(v); });
  const double total = lanes_total(lane_value);
  if (valid && lane == 0) scales[b] = static_cast<float>(total / static_cast<double>(length));
}

// One pass for the usual blocks (a multiple of 32, at most kMaxFusedBlock): a warp per
// block stages u in shared memory (making it from x + residual on the way), eight of its
// threads sum the CPU's lanes, then the warp ballots the bits and updates the residual.
constexpr int64_t kMaxFusedBlock = 1024;

__global__ void __launch_bounds__(kThreads)
    sign_fused(const float* x, float* residual, int64_t n, int64_t block, int64_t blocks, float* scales,
               uint32_t* words) {
  extern __shared__ float staged[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + warp;
  if (b >= blocks) return;  // the whole warp
  float* mine = staged + warp * block;
  const int64_t begin = b * block;
  const int64_t length = n - begin < block ? n - begin : block;
  for (int64_t e = lane; e < length; e += 32) {
    const float u = residual ? residual[begin + e] + x[begin + e] : x[begin + e];
    mine[e] = u;
  }
  __syncwarp();
  const float lane_value = lane_sum(mine, length, lane % kLanes, lane < kLanes, [](float v) { return fabsf(v); });
  double total = 0.0;
#pragma unroll
  for (int l = 0; l < kLanes; ++l) total += static_cast<double>(__shfl_sync(0xffffffffu, lane_value, l));
  const float scale = static_cast<float>(total / static_cast<double>(length));
  if (lane == 0) scales[b] = scale;
  for (int64_t first = 0; first < length; first += 32) {  // block % 32 == 0: words start with blocks
    const int64_t e = first + lane;
    const bool valid = e < length;
    const float u = valid ? mine[e] : 0.0f;
    const uint32_t bit = valid ? math::nonnegative_bit(u) : 0u;
    const uint32_t word = __ballot_sync(0xffffffffu, bit);
    if (lane == 0) words[(begin + first) / 32] = word;
    if (valid && residual) residual[begin + e] = u + (bit ? -scale : scale);
  }
}

__global__ void __launch_bounds__(kThreads)
    sign_bits(const float* u, int64_t n, int64_t block, const float* scales, uint32_t* words, float* residual) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = i < n;
  const float v = valid ? u[i] : 0.0f;
  const uint32_t bit = valid ? math::nonnegative_bit(v) : 0u;
  const uint32_t word = __ballot_sync(0xffffffffu, bit);
  if (threadIdx.x % 32 == 0 && i < n) words[i / 32] = word;
  if (valid && residual) {
    const float scale = block ? scales[i / block] : 1.0f;
    residual[i] = v + (bit ? -scale : scale);
  }
}

void encode_sign(const float* x, float* residual, int64_t n, int64_t block, uint8_t* payload, cudaStream_t stream) {
  std::vector<uint8_t> fields;
  wire::Writer w(fields);
  write_sign_fields(w, n, block);
  write_fixed_fields(payload, fields, stream);
  if (n <= 0) return;
  const SignLayout layout = sign_layout(n, block);
  const auto blocks = static_cast<int64_t>(layout.blocks);
  auto* scales = reinterpret_cast<float*>(payload + layout.scales.offset);
  auto* words = reinterpret_cast<uint32_t*>(payload + layout.bits.offset);
  if (blocks && block % 32 == 0 && block <= kMaxFusedBlock) {
    const size_t staged = sizeof(float) * static_cast<size_t>(block) * (kThreads / 32);
    sign_fused<<<blocks_for(blocks, kThreads / 32), kThreads, staged, stream>>>(x, residual, n, block, blocks, scales,
                                                                                 words);
    check_launch("sign_fused");
    return;
  }
  if (blocks) {
    // With error feedback the scale pass makes u in the residual; without, it reads x.
    sign_scales<<<blocks_for(blocks * kLanes, kThreads), kThreads, 0, stream>>>(
        residual ? x : nullptr, residual ? residual : const_cast<float*>(x), n, block, blocks, scales);
    check_launch("sign_scales");
  } else if (residual) {
    make_u(residual, x, n, stream);
  }
  sign_bits<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(residual ? residual : x, n, block, scales, words,
                                                              residual);
  check_launch("sign_bits");
}

// `count` payloads of one layout at payloads + r·stride (sections at the same offsets in
// each, 4-byte aligned), in one pass over out: out[i] = (set ? 0 : out[i]) + the terms of
// rows 0, 1, ... in order, each scaled and rounded as the host decoder's
// decode_add(..., scale) adds it.
struct SignRows {
  uint64_t scales_at, bits_at;
  uint32_t block;
};

__global__ void __launch_bounds__(kThreads)
    sign_add_rows(const uint8_t* payloads, size_t stride, int count, SignRows layout, float scale, bool set, float* out,
                  int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sum = set ? 0.0f : out[i];
  for (int r = 0; r < count; ++r) {
    const uint8_t* row = payloads + static_cast<size_t>(r) * stride;
    sum += math::sign_decoded(reinterpret_cast<const float*>(row + layout.scales_at),
                     reinterpret_cast<const uint32_t*>(row + layout.bits_at), layout.block, scale, i);
  }
  out[i] = sum;
}

void add_sign_rows(const uint8_t* payloads, size_t stride, int count, const SignRows& layout, float scale, bool set,
                   float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  sign_add_rows<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(payloads, stride, count, layout, scale, set, out, n);
  check_launch("sign_add_rows");
}

}  // namespace
}  // namespace gradzip::cuda

namespace gradzip {
namespace {

DevicePayload sign_device_encode(const Codec& sign, const float* x, int64_t n, float* residual,
                                 const EncodeContext&, DeviceArena& arena, cudaStream_t stream) {
  const SignParameters& codec = sign_parameters(sign);
  DevicePayload payload;
  payload.size = sign_layout(n, codec.block).bytes;
  payload.data = cuda::payload_memory(arena, payload.size);
  cuda::encode_sign(x, residual, n, codec.block, payload.data, stream);
  return payload;
}

bool sign_device_decode_rows(const PayloadRows& rows, float scale, bool set, float* out, int64_t n, int*,
                             cudaStream_t stream) {
  const auto layouts = cuda::row_layouts(rows, n, "sign", read_sign_layout);
  const auto key = [](const SignLayout& l) { return std::tuple(l.block, l.scales.offset, l.bits.offset); };
  if (!cuda::laid_out_alike(layouts, key)) return false;
  const SignLayout& first = layouts.front();
  cuda::add_sign_rows(rows.data, rows.stride, static_cast<int>(layouts.size()),
                      {first.scales.offset, first.bits.offset, first.block}, scale, set, out, n, stream);
  return true;
}

}  // namespace

const DeviceHalf kSignDevice = {sign_device_encode, cuda::decode_add_as_one_row<sign_device_decode_rows>, nullptr,
                                sign_device_decode_rows};

}  // namespace gradzip
