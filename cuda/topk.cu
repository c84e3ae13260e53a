// topk on the GPU: encode, and decode-add (decode_accumulate.h). fp32 payloads: the
// fixed fields from the host, then one thread per chosen entry writes its index and
// value bytes (at unaligned offsets) and clears its residual. Compact payloads
// (values=fp16|bf16) code the positions as stc does (positions.h) and write 16-bit
// values, leaving the residual u − what they decode to. Decode: one thread per entry.
#include "codec/element_math.cuh"
#include "codec/topk_codec.h"
#include "codec/wire.h"
#include "cuda_check.h"
#include "decode_accumulate.h"
#include "payload_memory.cuh"
#include "positions.h"
#include "topk_select.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    write_topk_entries(const float* u, const int64_t* indices, int64_t count, int width, uint8_t* index_bytes,
                       uint8_t* value_bytes, float* residual) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const int64_t i = indices[j];
  const float v = u[i];
  store_le(index_bytes + j * width, static_cast<uint64_t>(i), width);
  store_le(value_bytes + 4 * j, math::float_bits(v), 4);
  if (residual) residual[i] = v + -v;  // what decode_add(−1) leaves: u − u (NaN stays NaN)
}

// Compact payloads (values=fp16|bf16): entry j's value in 16 bits at an unaligned offset,
// saturating as the host's; the residual u + (−1 · what it decodes to).
__global__ void __launch_bounds__(kThreads)
    write_compact_values(const float* u, const int64_t* indices, int64_t count, bool fp16, uint8_t* values,
                         float* residual) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const int64_t i = indices[j];
  const float v = u[i];
  const uint16_t bits = math::compact_value_bits(v, fp16);
  store_le(values + 2 * j, bits, 2);
  if (residual) residual[i] = v + -1.0f * math::compact_value(bits, fp16);
}

__global__ void __launch_bounds__(kThreads)
    topk_add(const uint8_t* index_bytes, const uint8_t* value_bytes, int64_t k, int width, float* out, int64_t n,
             int* error) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const uint64_t index = load_le(index_bytes + j * width, width);
  const bool ascending = j == 0 || load_le(index_bytes + (j - 1) * width, width) < index;
  if (index >= static_cast<uint64_t>(n) || !ascending) {
    atomicOr(error, kBadIndex);
    return;
  }
  out[index] += math::bits_float(static_cast<uint32_t>(load_le(value_bytes + 4 * j, 4)));
}

// Compact top-k: entry j's 16-bit value (at an unaligned offset) added at position j.
__global__ void __launch_bounds__(kThreads)
    compact_add(const int64_t* indices, const uint8_t* values, bool fp16, int64_t k, float* out, int64_t n,
                const int* error) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k || *error) return;
  const int64_t i = indices[j];
  if (i < 0 || i >= n) return;  // unreachable for a payload that passed; kept as the bound of every write
  out[i] += math::compact_value(static_cast<uint16_t>(load_le(values + 2 * j, 2)), fp16);
}

// The fp32 payload of the chosen entries (indices: `count`, ascending, of u); residual
// is u itself (or null), and gets u − u at the chosen entries.
void write_topk_payload(const float* u, int64_t n, const int64_t* indices, int64_t count, float* residual,
                        uint8_t* payload, cudaStream_t stream) {
  const TopKLayout layout = topk_layout(static_cast<uint64_t>(count), topk_index_width(n));
  std::vector<uint8_t> fields;
  wire::Writer w(fields);
  write_topk_fields(w, n, layout);
  write_fixed_fields(payload, fields, stream);
  if (count <= 0) return;
  write_topk_entries<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(
      u, indices, count, layout.width, payload + layout.indices.offset, payload + layout.values.offset, residual);
  check_launch("write_topk_entries");
}

}  // namespace
}  // namespace gradzip::cuda

namespace gradzip {
namespace {

// Compact: the positions coded as STC codes them (one stream synchronization for their
// length), then the 16-bit values.
DevicePayload compact_device_encode(const TopKParameters& codec, const cuda::Selection& chosen, int64_t n,
                                    float* residual, DeviceArena& arena, cudaStream_t stream) {
  void* scratch = arena.allocate(cuda::position_writing_scratch_bytes(n, chosen.count));
  const cuda::PositionPlan plan = cuda::plan_positions(n, chosen.indices, chosen.count, scratch, stream);
  const TopKLayout layout = compact_topk_layout(static_cast<uint64_t>(chosen.count), codec.values, plan.coding());
  DevicePayload payload;
  payload.size = layout.bytes;
  payload.data = cuda::payload_memory(arena, payload.size);
  std::vector<uint8_t> fields;
  wire::Writer w(fields);
  write_topk_fields(w, n, layout);
  cuda::write_fixed_fields(payload.data, fields, stream);
  if (chosen.count <= 0) return payload;
  cuda::write_positions_on_device(plan, n, chosen.indices, chosen.count, payload.data + layout.positions.bytes.offset,
                                  scratch, stream);
  cuda::write_compact_values<<<cuda::blocks_for(chosen.count, cuda::kThreads), cuda::kThreads, 0, stream>>>(
      chosen.u, chosen.indices, chosen.count, codec.values == ValueType::kFp16, payload.data + layout.values.offset,
      residual);
  cuda::check_launch("write_compact_values");
  return payload;
}

DevicePayload topk_device_encode(const Codec& topk, const float* x, int64_t n, float* residual,
                                 const EncodeContext&, DeviceArena& arena, cudaStream_t stream) {
  const TopKParameters& codec = topk_parameters(topk);
  const cuda::Selection chosen = cuda::select_on_device(codec.selection, x, n, residual, arena, stream);
  if (codec.values != ValueType::kFp32) return compact_device_encode(codec, chosen, n, residual, arena, stream);
  DevicePayload payload;
  payload.size = topk_layout(static_cast<uint64_t>(chosen.count), topk_index_width(n)).bytes;
  payload.data = cuda::payload_memory(arena, payload.size);
  cuda::write_topk_payload(chosen.u, n, chosen.indices, chosen.count, residual, payload.data, stream);
  return payload;
}

void topk_device_decode_add(const uint8_t* payload, const uint8_t* prefix, size_t have, size_t size, float* out,
                            int64_t n, int* error, DeviceArena& arena, cudaStream_t stream) {
  wire::Reader r(prefix, have, size, "topk");
  const TopKLayout layout = read_topk_layout(r, n);
  const auto k = static_cast<int64_t>(layout.k);
  if (layout.value_type == ValueType::kFp32) {
    if (k <= 0) return;
    cuda::topk_add<<<cuda::blocks_for(k, cuda::kThreads), cuda::kThreads, 0, stream>>>(
        payload + layout.indices.offset, payload + layout.values.offset, k, layout.width, out, n, error);
    cuda::check_launch("topk_add");
    return;
  }
  // Payloads decode one after the other on the stream: one scratch serves them all.
  void* scratch = arena.reusable(cuda::position_reading_scratch_bytes(n, k, layout.positions));
  const int64_t* indices = cuda::read_positions_on_device(payload, layout.positions, k, n, error, scratch, stream);
  if (indices == nullptr) return;
  cuda::compact_add<<<cuda::blocks_for(k, cuda::kThreads), cuda::kThreads, 0, stream>>>(
      indices, payload + layout.values.offset, layout.value_type == ValueType::kFp16, k, out, n, error);
  cuda::check_launch("compact_add");
}

}  // namespace

const DeviceHalf kTopKDevice = {topk_device_encode, topk_device_decode_add, nullptr, nullptr};

}  // namespace gradzip
