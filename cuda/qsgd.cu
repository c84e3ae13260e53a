// qsgd payload on the GPU: bucket norms (eight threads per bucket in the CPU's lane
// order, block_lanes.cuh), then one thread per quad of a bucket draws its Philox4x32-10
// block counted by (first element, step, rank), as the CPU does, quantizes four
// elements and ORs their codes into packed words (integer atomics: order-free). One pass
// (qsgd_fused) for buckets that are multiples of 32 up to 1024 (the default 512); two
// otherwise.
#include <tuple>

#include "codec/wire.h"
#include "codec/block_lanes.cuh"
#include "cuda_check.h"
#include "codec/element_math.cuh"
#include "payload_memory.cuh"
#include "codec/qsgd_codec.h"
#include "decode_accumulate.h"
#include "payload_rows.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    qsgd_norms(const float* u, int64_t n, int64_t bucket, int64_t buckets, bool max_norm, float* norms) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t b = t / kLanes;
  const int lane = static_cast<int>(t % kLanes);
  const bool valid = b < buckets;
  const int64_t begin = valid ? b * bucket : 0;
  const int64_t length = valid ? (n - begin < bucket ? n - begin : bucket) : 0;
  const float* v = u + begin;
  if (!max_norm) {
    const float lane_value = lane_sum(v, length, lane, valid, [](float x) { return x * x; });
    const double total = lanes_total(lane_value);
    if (valid && lane == 0) norms[b] = static_cast<float>(sqrt(total));
    return;
  }
  // max |v|, ignoring NaN as std::max does; but the first NaN (in index order) wins.
  float largest = 0.0f;
  int64_t first_nan = INT64_MAX;
  for (int64_t i = lane; i < length; i += kLanes) {
    const float magnitude = fabsf(v[i]);
    largest = largest < magnitude ? magnitude : largest;
    if (isnan(v[i]) && i < first_nan) first_nan = i;
  }
#pragma unroll
  for (int step = 1; step < kLanes; step *= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, largest, step);
    const long long other_nan = __shfl_xor_sync(0xffffffffu, static_cast<long long>(first_nan), step);
    largest = largest < other ? other : largest;
    first_nan = other_nan < first_nan ? other_nan : first_nan;
  }
  if (valid && lane == 0) norms[b] = first_nan != INT64_MAX ? v[first_nan] : largest;
}

__global__ void __launch_bounds__(kThreads)
    qsgd_codes(const float* u, int64_t n, int64_t bucket, int64_t quads_per_bucket, int64_t quads, uint32_t levels,
               int width, const float* norms, uint64_t seed, uint32_t step, uint32_t rank, uint32_t* words,
               float* residual) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= quads) return;
  const int64_t b = t / quads_per_bucket;
  const int64_t begin = b * bucket;
  const int64_t end = n - begin < bucket ? n : begin + bucket;
  const int64_t first = static_cast<int64_t>(
      math::qsgd_philox_counter(static_cast<uint64_t>(begin + 4 * (t % quads_per_bucket)), static_cast<uint64_t>(begin)));
  if (first >= end) return;
  const float norm = norms[b];
  const float inverse = norm > 0.0f ? 1.0f / norm : 0.0f;
  const uint32_t sign_bit = 1u << (width - 1);
  const uint64_t counter = static_cast<uint64_t>(first);
  const math::Philox4 random =
      math::philox4x32_10(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), step, rank,
                          static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const float unit = -norm / static_cast<float>(levels);  // decode_add(−1)'s step, for the residual
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = first + j;
    if (i >= end) break;
    const float v = u[i];
    const uint32_t code = math::qsgd_code(v, inverse, levels, sign_bit, random.v[j]);
    const uint64_t position = static_cast<uint64_t>(i) * static_cast<uint64_t>(width);
    const int offset = static_cast<int>(position % 32);
    atomicOr(&words[position / 32], code << offset);
    if (offset + width > 32) atomicOr(&words[position / 32 + 1], code >> (32 - offset));
    if (residual) {
      const float magnitude = unit * static_cast<float>(code & (sign_bit - 1));
      residual[i] = v + ((code & sign_bit) ? -magnitude : magnitude);
    }
  }
}

// One pass for the usual buckets (a multiple of 32, at most kMaxFusedBucket): a warp per
// bucket stages it in shared memory, takes its norm in the CPU's lane order, then packs
// its codes into shared words (the bucket's bits start on a word: bucket·width % 32 = 0)
// and stores them whole, with no global atomics.
constexpr int64_t kMaxFusedBucket = 1024;

__device__ __forceinline__ float max_norm_of(const float* v, int64_t length, int lane) {
  float largest = 0.0f;
  int64_t first_nan = INT64_MAX;
  if (lane < kLanes) {
    for (int64_t i = lane; i < length; i += kLanes) {
      const float magnitude = fabsf(v[i]);
      largest = largest < magnitude ? magnitude : largest;
      if (isnan(v[i]) && i < first_nan) first_nan = i;
    }
  }
#pragma unroll
  for (int step = 1; step < kLanes; step *= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, largest, step);
    const long long other_nan = __shfl_xor_sync(0xffffffffu, static_cast<long long>(first_nan), step);
    largest = largest < other ? other : largest;
    first_nan = other_nan < first_nan ? other_nan : first_nan;
  }
  const float norm = first_nan != INT64_MAX ? v[first_nan] : largest;
  return __shfl_sync(0xffffffffu, norm, 0);
}

// With error feedback the staging load makes u = residual + x (as make_u would), so x
// and the residual are each read once and the residual written once.
__global__ void __launch_bounds__(kThreads)
    qsgd_fused(const float* x, int64_t n, int64_t bucket, int64_t buckets, bool max_norm, uint32_t levels, int width,
               uint64_t seed, uint32_t step, uint32_t rank, float* norms, uint32_t* words, float* residual) {
  extern __shared__ uint32_t staged[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + warp;
  if (b >= buckets) return;  // the whole warp
  const int64_t code_words = bucket * width / 32;
  float* mine = reinterpret_cast<float*>(staged + warp * (bucket + code_words));
  uint32_t* packed = staged + warp * (bucket + code_words) + bucket;
  const int64_t begin = b * bucket;
  const int64_t length = n - begin < bucket ? n - begin : bucket;
  for (int64_t e = lane; e < length; e += 32) mine[e] = residual ? residual[begin + e] + x[begin + e] : x[begin + e];
  for (int64_t w = lane; w < code_words; w += 32) packed[w] = 0;
  __syncwarp();
  float norm;
  if (max_norm) {
    norm = max_norm_of(mine, length, lane);
  } else {
    const float lane_value = lane_sum(mine, length, lane % kLanes, lane < kLanes, [](float v) { return v * v; });
    double total = 0.0;
#pragma unroll
    for (int l = 0; l < kLanes; ++l) total += static_cast<double>(__shfl_sync(0xffffffffu, lane_value, l));
    norm = static_cast<float>(sqrt(total));
  }
  if (lane == 0) norms[b] = norm;
  const float inverse = norm > 0.0f ? 1.0f / norm : 0.0f;
  const float unit = -norm / static_cast<float>(levels);
  const uint32_t sign_bit = 1u << (width - 1);
  for (int64_t quad = lane; 4 * quad < length; quad += 32) {
    const uint64_t counter = static_cast<uint64_t>(begin + 4 * quad);
    const math::Philox4 random =
        math::philox4x32_10(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), step, rank,
                            static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t e = 4 * quad + j;
      if (e >= length) break;
      const float v = mine[e];
      const uint32_t code = math::qsgd_code(v, inverse, levels, sign_bit, random.v[j]);
      const int64_t position = e * width;
      const int offset = static_cast<int>(position % 32);
      atomicOr(&packed[position / 32], code << offset);
      if (offset + width > 32) atomicOr(&packed[position / 32 + 1], code >> (32 - offset));
      if (residual) {
        const float magnitude = unit * static_cast<float>(code & (sign_bit - 1));
        residual[begin + e] = v + ((code & sign_bit) ? -magnitude : magnitude);
      }
    }
  }
  __syncwarp();
  const int64_t used_words = (length * width + 31) / 32;
  for (int64_t w = lane; w < used_words; w += 32) words[begin * width / 32 + w] = packed[w];
}

void encode_qsgd(const float* x, float* residual, int64_t n, int levels, int64_t bucket, bool max_norm,
                 uint64_t seed, uint64_t step, uint32_t rank, uint8_t* payload, cudaStream_t stream) {
  const QsgdLayout layout = qsgd_layout(n, levels, max_norm, bucket);
  const int width = layout.width;
  std::vector<uint8_t> fields;
  wire::Writer w(fields);
  write_qsgd_fields(w, n, layout);
  write_fixed_fields(payload, fields, stream);
  if (n <= 0) return;
  const auto buckets = static_cast<int64_t>(layout.buckets);
  auto* norms = reinterpret_cast<float*>(payload + layout.norms.offset);
  auto* words = reinterpret_cast<uint32_t*>(payload + layout.codes.offset);
  if (bucket % 32 == 0 && bucket <= kMaxFusedBucket) {
    const size_t staged = sizeof(uint32_t) * static_cast<size_t>(bucket + bucket * width / 32) * (kThreads / 32);
    qsgd_fused<<<blocks_for(buckets, kThreads / 32), kThreads, staged, stream>>>(
        x, n, bucket, buckets, max_norm, static_cast<uint32_t>(levels), width, seed, static_cast<uint32_t>(step), rank,
        norms, words, residual);
    check_launch("qsgd_fused");
    return;
  }
  if (residual) make_u(residual, x, n, stream);
  const float* u = residual ? residual : x;
  const size_t code_bytes = layout.codes.bytes;
  check(cudaMemsetAsync(words, 0, (code_bytes + 3) / 4 * 4, stream), "clearing the QSGD codes");
  qsgd_norms<<<blocks_for(buckets * kLanes, kThreads), kThreads, 0, stream>>>(u, n, bucket, buckets, max_norm, norms);
  check_launch("qsgd_norms");
  const int64_t quads_per_bucket = (bucket + 3) / 4;
  const int64_t quads = buckets * quads_per_bucket;
  qsgd_codes<<<blocks_for(quads, kThreads), kThreads, 0, stream>>>(u, n, bucket, quads_per_bucket, quads,
                                                                   static_cast<uint32_t>(levels), width, norms, seed,
                                                                   static_cast<uint32_t>(step), rank, words, residual);
  check_launch("qsgd_codes");
}

// `count` payloads of one layout at payloads + r·stride (sections at the same offsets in
// each, 4-byte aligned), in one pass over out: out[i] = (set ? 0 : out[i]) + the terms of
// rows 0, 1, ... in order, each scaled and rounded as the host decoder's
// decode_add(..., scale) adds it.
// A level above s sets kBadLevel in errors[r].
struct QsgdRows {
  uint64_t norms_at, codes_at;
  int width;
  uint32_t levels, bucket;
};

__global__ void __launch_bounds__(kThreads)
    qsgd_add_rows(const uint8_t* payloads, size_t stride, int count, QsgdRows layout, float scale, bool set, float* out,
                  int64_t n, int* errors) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sum = set ? 0.0f : out[i];
  for (int r = 0; r < count; ++r) {
    const uint8_t* row = payloads + static_cast<size_t>(r) * stride;
    float term;
    if (math::qsgd_decoded(reinterpret_cast<const float*>(row + layout.norms_at),
                  reinterpret_cast<const uint32_t*>(row + layout.codes_at), layout.width, layout.levels, layout.bucket,
                  scale, i, term)) {
      sum += term;
    } else {
      atomicOr(errors + r, kBadLevel);
    }
  }
  out[i] = sum;
}

void add_qsgd_rows(const uint8_t* payloads, size_t stride, int count, const QsgdRows& layout, float scale, bool set,
                   float* out, int64_t n, int* errors, cudaStream_t stream) {
  if (n <= 0) return;
  qsgd_add_rows<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(payloads, stride, count, layout, scale, set, out, n,
                                                                   errors);
  check_launch("qsgd_add_rows");
}

}  // namespace
}  // namespace gradzip::cuda

namespace gradzip {
namespace {

DevicePayload qsgd_device_encode(const Codec& qsgd, const float* x, int64_t n, float* residual,
                                 const EncodeContext& ctx, DeviceArena& arena, cudaStream_t stream) {
  const QsgdParameters& codec = qsgd_parameters(qsgd);
  DevicePayload payload;
  payload.size = qsgd_layout(n, codec.levels, codec.max_norm, codec.bucket).bytes;
  payload.data = cuda::payload_memory(arena, payload.size);
  cuda::encode_qsgd(x, residual, n, codec.levels, codec.bucket, codec.max_norm, ctx.seed, ctx.step, ctx.rank,
                    payload.data, stream);
  return payload;
}

bool qsgd_device_decode_rows(const PayloadRows& rows, float scale, bool set, float* out, int64_t n, int* errors,
                             cudaStream_t stream) {
  const auto layouts = cuda::row_layouts(rows, n, "qsgd", read_qsgd_layout);
  const auto key = [](const QsgdLayout& l) {
    return std::tuple(l.width, l.levels, l.bucket, l.norms.offset, l.codes.offset);
  };
  if (!cuda::laid_out_alike(layouts, key)) return false;
  const QsgdLayout& first = layouts.front();
  cuda::add_qsgd_rows(rows.data, rows.stride, static_cast<int>(layouts.size()),
                      {first.norms.offset, first.codes.offset, first.width, first.levels, first.bucket}, scale, set,
                      out, n, errors, stream);
  return true;
}

}  // namespace

const DeviceHalf kQsgdDevice = {qsgd_device_encode, cuda::decode_add_as_one_row<qsgd_device_decode_rows>, nullptr,
                                qsgd_device_decode_rows};

}  // namespace gradzip
