// stc payload on the GPU. μ: one block of kStcMeanLanes threads sums |u| of the chosen
// entries in the CPU's fixed lane order (math::kStcMeanLanes), in double. Positions:
// per-entry Golomb-Rice code lengths, an exclusive scan (CUB) for their bit offsets,
// then every entry ORs its code into 32-bit words (integer atomics: the order does not
// matter); or the bitmap. Sign bits by warp ballots in entry order. The word buffers
// are aligned scratch, copied to the payload's (unaligned) sections.
#include <cub/device/device_scan.cuh>

#include "codec/codec_base.h"
#include "codec/wire.h"
#include "cuda_check.h"
#include "codec/element_math.cuh"
#include "encoders.h"
#include "payload_bytes.cuh"
#include "scratch_carver.h"
#include "codec/stc_codec.h"
#include "decode_accumulate.h"
#include "topk_select.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

struct Scratch {
  uint64_t* code_bits;  // count
  uint64_t* code_starts;  // count
  uint32_t* positions;  // ceil(n/32) + 2 words: the bitmap, or the Golomb codes (used only when not longer)
  uint32_t* signs;      // ceil(count/32) words
  double* lanes;        // μ's kStcMeanLanes lane sums
  void* cub_temp;
  size_t cub_bytes;
  size_t total;

  Scratch(void* base, int64_t n, int64_t count) {
    ScratchCarver carve(base);
    code_bits = carve.take<uint64_t>(static_cast<size_t>(count));
    code_starts = carve.take<uint64_t>(static_cast<size_t>(count));
    positions = carve.take<uint32_t>(static_cast<size_t>(n) / 32 + 2);
    signs = carve.take<uint32_t>(static_cast<size_t>(count) / 32 + 1);
    lanes = carve.take<double>(math::kStcMeanLanes);
    cub_bytes = 0;
    check(cub::DeviceScan::ExclusiveSum(nullptr, cub_bytes, code_bits, code_starts, count), "cub::DeviceScan (size)");
    cub_temp = carve.take_bytes(cub_bytes);
    total = carve.size();
  }
};

// μ in the CPU's order (math::kStcMeanLanes): each lane's entries in entry order, one
// thread per lane, the lanes spread over kMeanBlocks blocks (so over as many SMs, for
// their gathers' latency); then one thread adds the lanes in lane order.
constexpr int kMeanBlocks = 32;
static_assert(math::kStcMeanLanes % kMeanBlocks == 0, "lanes split evenly over the blocks");

__global__ void __launch_bounds__(math::kStcMeanLanes / kMeanBlocks)
    stc_lane_sums(const float* u, const int64_t* indices, int64_t count, double* lanes) {
  const int l = blockIdx.x * blockDim.x + threadIdx.x;
  double lane = 0.0;
  for (int64_t j = l; j < count; j += math::kStcMeanLanes) lane += fabs(static_cast<double>(u[indices[j]]));
  lanes[l] = lane;
}

__global__ void stc_mean(const double* lanes, int64_t count, float* mu) {
  double total = 0.0;
  for (int l = 0; l < math::kStcMeanLanes; ++l) total += lanes[l];
  *mu = count ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;
}

__device__ __forceinline__ uint64_t gap_before(const int64_t* indices, int64_t j) {
  return static_cast<uint64_t>(indices[j] - (j ? indices[j - 1] : -1) - 1);
}

__global__ void __launch_bounds__(kThreads)
    golomb_code_bits(const int64_t* indices, int64_t count, int b, uint64_t* bits) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < count) bits[j] = math::golomb_rice_bits(gap_before(indices, j), b);
}

// ORs the low `length` bits of value into the bit string at `position`.
__device__ __forceinline__ void or_bits(uint32_t* words, uint64_t position, uint64_t value, int length) {
  while (length > 0) {
    const int offset = static_cast<int>(position % 32);
    const int take = length < 32 - offset ? length : 32 - offset;
    const uint32_t part = static_cast<uint32_t>(value & ((uint64_t{1} << take) - 1));
    atomicOr(&words[position / 32], part << offset);
    position += take;
    value >>= take;
    length -= take;
  }
}

__global__ void __launch_bounds__(kThreads)
    write_golomb_codes(const int64_t* indices, const uint64_t* starts, int64_t count, int b, uint32_t* words) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const uint64_t gap = gap_before(indices, j);
  uint64_t position = starts[j];
  // The unary quotient: its share of the first word (which it may share with the code
  // before), whole words (this code's alone: plain stores, no atomics), the rest.
  uint64_t ones = gap >> b;
  const uint64_t lead = ones < (32 - position % 32) % 32 ? ones : (32 - position % 32) % 32;
  if (lead) or_bits(words, position, 0xffffffffu, static_cast<int>(lead));
  position += lead;
  ones -= lead;
  for (; ones >= 32; ones -= 32, position += 32) words[position / 32] = 0xffffffffu;
  if (ones) or_bits(words, position, 0xffffffffu, static_cast<int>(ones));
  position += ones + 1;  // the terminating zero
  if (b) or_bits(words, position, gap & ((uint64_t{1} << b) - 1), b);
}

__global__ void __launch_bounds__(kThreads) mark_bitmap(const int64_t* indices, int64_t count, uint32_t* words) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < count) atomicOr(&words[indices[j] / 32], 1u << (indices[j] % 32));
}

// Sign bits in entry order (1 = non-negative), and the residual update u − (±μ).
__global__ void __launch_bounds__(kThreads)
    stc_signs(const float* u, const int64_t* indices, int64_t count, const float* mu, uint32_t* words,
              float* residual) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = j < count;
  const float v = valid ? u[indices[j]] : 0.0f;
  const uint32_t bit = valid ? math::nonnegative_bit(v) : 0u;
  const uint32_t word = __ballot_sync(0xffffffffu, bit);
  if (valid && threadIdx.x % 32 == 0) words[j / 32] = word;
  if (valid && residual) residual[indices[j]] = v + (bit ? -*mu : *mu);
}

}  // namespace

size_t stc_scratch_bytes(int64_t n, int64_t count) { return Scratch(nullptr, n, count).total; }

StcPlan stc_plan(int64_t n, const int64_t* indices, int64_t count, void* scratch, cudaStream_t stream) {
  StcPlan plan;
  plan.golomb_parameter = golomb_parameter(count, n);
  if (count > 0) {
    const Scratch s(scratch, n, count);
    golomb_code_bits<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(indices, count, plan.golomb_parameter,
                                                                           s.code_bits);
    check_launch("golomb_code_bits");
    size_t bytes = s.cub_bytes;
    check(cub::DeviceScan::ExclusiveSum(s.cub_temp, bytes, s.code_bits, s.code_starts, count, stream),
          "cub::DeviceScan");
    uint64_t last[2];  // the last code's start and length
    check(cudaMemcpyAsync(&last[0], s.code_starts + count - 1, 8, cudaMemcpyDeviceToHost, stream), "reading the Golomb length");
    check(cudaMemcpyAsync(&last[1], s.code_bits + count - 1, 8, cudaMemcpyDeviceToHost, stream), "reading the Golomb length");
    check(cudaStreamSynchronize(stream), "stc positions");
    plan.golomb_bits = last[0] + last[1];
  }
  const uint64_t golomb_bytes = wire::bytes_for_bits(plan.golomb_bits);
  plan.bitmap = golomb_bytes > wire::bytes_for_bits(static_cast<uint64_t>(n));
  plan.position_bytes = plan.bitmap ? wire::bytes_for_bits(static_cast<uint64_t>(n)) : golomb_bytes;
  return plan;
}

void write_positions_on_device(const StcPlan& plan, int64_t n, const int64_t* indices, int64_t count, uint8_t* out,
                               void* scratch, cudaStream_t stream) {
  if (count <= 0) return;
  const Scratch s(scratch, n, count);
  const size_t words = (plan.position_bytes + 3) / 4;
  check(cudaMemsetAsync(s.positions, 0, 4 * words, stream), "clearing the positions");
  if (plan.bitmap) {
    mark_bitmap<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(indices, count, s.positions);
    check_launch("mark_bitmap");
  } else {
    write_golomb_codes<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(indices, s.code_starts, count,
                                                                             plan.golomb_parameter, s.positions);
    check_launch("write_golomb_codes");
  }
  check(cudaMemcpyAsync(out, s.positions, plan.position_bytes, cudaMemcpyDeviceToDevice, stream),
        "copying the positions");
}

void write_stc_payload(const StcPlan& plan, const float* u, int64_t n, const int64_t* indices, int64_t count,
                       float* residual, uint8_t* payload, void* scratch, cudaStream_t stream) {
  const Scratch s(scratch, n, count);
  const StcLayout layout = stc_layout(static_cast<uint64_t>(count), 0.0f, plan.coding());  // μ: stc_mean below
  std::vector<uint8_t> fields;
  wire::Writer w(fields);
  write_stc_fields(w, n, layout);
  write_fixed_fields(payload, fields, stream);
  auto* mu = reinterpret_cast<float*>(payload + layout.mean.offset);  // 4-byte aligned
  stc_lane_sums<<<kMeanBlocks, math::kStcMeanLanes / kMeanBlocks, 0, stream>>>(u, indices, count, s.lanes);
  check_launch("stc_lane_sums");
  stc_mean<<<1, 1, 0, stream>>>(s.lanes, count, mu);
  check_launch("stc_mean");
  if (count <= 0) return;
  write_positions_on_device(plan, n, indices, count, payload + layout.positions.bytes.offset, scratch, stream);
  stc_signs<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(u, indices, count, mu, s.signs, residual);
  check_launch("stc_signs");
  check(cudaMemcpyAsync(payload + layout.signs.offset, s.signs, layout.signs.bytes,
                        cudaMemcpyDeviceToDevice, stream),
        "copying the sign bits");
}

}  // namespace gradzip::cuda

namespace gradzip {
namespace {

DevicePayload stc_device_encode(const Codec& stc, const float* x, int64_t n, float* residual,
                                const EncodeContext&, DeviceArena& arena, cudaStream_t stream) {
  const cuda::Selection chosen = cuda::select_on_device(stc_parameters(stc).selection, x, n, residual, arena, stream);
  void* scratch = arena.allocate(cuda::stc_scratch_bytes(n, chosen.count));
  const cuda::StcPlan plan = cuda::stc_plan(n, chosen.indices, chosen.count, scratch, stream);
  DevicePayload payload;
  payload.size = stc_layout(static_cast<uint64_t>(chosen.count), 0.0f, plan.coding()).bytes;
  payload.data = cuda::payload_memory(arena, payload.size);
  cuda::write_stc_payload(plan, chosen.u, n, chosen.indices, chosen.count, residual, payload.data, scratch, stream);
  return payload;
}

void stc_device_decode_add(const uint8_t* payload, const uint8_t* prefix, size_t have, size_t size, float* out,
                           int64_t n, int* error, DeviceArena& arena, cudaStream_t stream) {
  wire::Reader r(prefix, have, size, "stc");
  const StcLayout layout = read_stc_layout(r, n);
  const auto k = static_cast<int64_t>(layout.k);
  // Payloads decode one after the other on the stream: one scratch serves them all.
  void* scratch =
      arena.reusable(cuda::positions_scratch_bytes(n, k, layout.positions.bytes.bytes, layout.positions.bitmap));
  cuda::add_stc(payload + layout.positions.bytes.offset, layout.positions.bytes.bytes, layout.positions.bitmap,
                layout.positions.golomb_parameter,
                payload + layout.signs.offset, k, layout.mu, out, n, error, scratch, stream);
}

}  // namespace

const DeviceHalf kStcDevice = {stc_device_encode, stc_device_decode_add, nullptr, nullptr};

}  // namespace gradzip
