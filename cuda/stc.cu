// stc on the GPU: encode, and decode-add (decode_accumulate.h).
// μ: one block of kStcMeanLanes threads sums |u| of the chosen entries in the CPU's
// fixed lane order (math::kStcMeanLanes), in double. Positions: positions.h. Sign bits by
// warp ballots in entry order; the word buffer is aligned scratch, copied to the
// payload's (unaligned) section. Decode: the positions (positions.h), then ±μ added at
// each.
#include "codec/codec_base.h"
#include "codec/element_math.cuh"
#include "codec/stc_codec.h"
#include "codec/wire.h"
#include "cuda_check.h"
#include "decode_accumulate.h"
#include "payload_memory.cuh"
#include "positions.h"
#include "scratch_carver.h"
#include "topk_select.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

// The encoder's own scratch: the sign words and μ's lane sums.
struct StcScratch {
  uint32_t* signs;  // ceil(count/32) words
  double* lanes;    // μ's kStcMeanLanes lane sums
  size_t total;

  StcScratch(void* base, int64_t count) {
    ScratchCarver carve(base);
    signs = carve.take<uint32_t>(static_cast<size_t>(count) / 32 + 1);
    lanes = carve.take<double>(math::kStcMeanLanes);
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

__global__ void __launch_bounds__(kThreads)
    stc_add(const int64_t* indices, const uint8_t* signs, int64_t k, float mu, float* out, int64_t n,
            const int* error) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k || *error) return;
  const int64_t i = indices[j];
  if (i < 0 || i >= n) return;  // unreachable for a payload that passed; kept as the bound of every write
  out[i] += ((signs[j / 8] >> (j % 8)) & 1) ? mu : -mu;
}

// The payload of the chosen entries (indices: `count`, ascending), their positions
// planned; leaves the residual u − what it decodes to.
void write_stc_payload(const PositionPlan& plan, const float* u, int64_t n, const int64_t* indices, int64_t count,
                       float* residual, uint8_t* payload, void* positions_scratch, const StcScratch& s,
                       cudaStream_t stream) {
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
  write_positions_on_device(plan, n, indices, count, payload + layout.positions.bytes.offset, positions_scratch,
                            stream);
  stc_signs<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(u, indices, count, mu, s.signs, residual);
  check_launch("stc_signs");
  check(cudaMemcpyAsync(payload + layout.signs.offset, s.signs, layout.signs.bytes,
                        cudaMemcpyDeviceToDevice, stream),
        "copying the sign bits");
}

}  // namespace
}  // namespace gradzip::cuda

namespace gradzip {
namespace {

DevicePayload stc_device_encode(const Codec& stc, const float* x, int64_t n, float* residual,
                                const EncodeContext&, DeviceArena& arena, cudaStream_t stream) {
  const cuda::Selection chosen = cuda::select_on_device(stc_parameters(stc).selection, x, n, residual, arena, stream);
  void* positions_scratch = arena.allocate(cuda::position_writing_scratch_bytes(n, chosen.count));
  const cuda::PositionPlan plan = cuda::plan_positions(n, chosen.indices, chosen.count, positions_scratch, stream);
  const cuda::StcScratch scratch(arena.allocate(cuda::StcScratch(nullptr, chosen.count).total), chosen.count);
  DevicePayload payload;
  payload.size = stc_layout(static_cast<uint64_t>(chosen.count), 0.0f, plan.coding()).bytes;
  payload.data = cuda::payload_memory(arena, payload.size);
  cuda::write_stc_payload(plan, chosen.u, n, chosen.indices, chosen.count, residual, payload.data, positions_scratch,
                          scratch, stream);
  return payload;
}

void stc_device_decode_add(const uint8_t* payload, const uint8_t* prefix, size_t have, size_t size, float* out,
                           int64_t n, int* error, DeviceArena& arena, cudaStream_t stream) {
  wire::Reader r(prefix, have, size, "stc");
  const StcLayout layout = read_stc_layout(r, n);
  const auto k = static_cast<int64_t>(layout.k);
  // Payloads decode one after the other on the stream: one scratch serves them all.
  void* scratch = arena.reusable(cuda::position_reading_scratch_bytes(n, k, layout.positions));
  const int64_t* indices = cuda::read_positions_on_device(payload, layout.positions, k, n, error, scratch, stream);
  if (indices == nullptr) return;
  cuda::stc_add<<<cuda::blocks_for(k, cuda::kThreads), cuda::kThreads, 0, stream>>>(
      indices, payload + layout.signs.offset, k, layout.mu, out, n, error);
  cuda::check_launch("stc_add");
}

}  // namespace

const DeviceHalf kStcDevice = {stc_device_encode, stc_device_decode_add, nullptr, nullptr};

}  // namespace gradzip
