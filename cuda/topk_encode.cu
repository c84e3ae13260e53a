// topk payload on the GPU: the fixed fields from the host, then one thread per chosen
// entry writes its index and value bytes (at unaligned offsets) and clears its residual.
#include "codec/wire.h"
#include "cuda_check.h"
#include "codec/element_math.cuh"
#include "encoders.h"
#include "payload_bytes.cuh"
#include "codec/topk_codec.h"
#include "decode_accumulate.h"
#include "topk_select.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

int index_width(int64_t n) { return n <= (int64_t{1} << 32) ? 4 : 8; }

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

}  // namespace

uint8_t* payload_memory(DeviceArena& arena, size_t size) {
  return static_cast<uint8_t*>(arena.payload(size < 8 ? 8 : (size + 7) / 8 * 8));
}

size_t topk_payload_bytes(int64_t n, int64_t count) {
  return kPayloadHeaderBytes + 8 + 1 + static_cast<size_t>(count) * (index_width(n) + 4);
}

void write_topk_payload(const float* u, int64_t n, const int64_t* indices, int64_t count, float* residual,
                        uint8_t* payload, cudaStream_t stream) {
  const int width = index_width(n);
  std::vector<uint8_t> fields;
  wire::Writer w(fields);
  w.header(CodecId::kTopK, static_cast<uint64_t>(n));
  w.put<uint64_t>(static_cast<uint64_t>(count));
  w.put<uint8_t>(static_cast<uint8_t>(width));
  write_fixed_fields(payload, fields, stream);
  if (count <= 0) return;
  uint8_t* index_bytes = payload + fields.size();
  write_topk_entries<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(
      u, indices, count, width, index_bytes, index_bytes + count * width, residual);
  check_launch("write_topk_entries");
}

}  // namespace gradzip::cuda

namespace gradzip {
namespace {

DevicePayload topk_device_encode(const CodecParameters& codec, const float* x, int64_t n, float* residual,
                                 const EncodeContext&, DeviceArena& arena, cudaStream_t stream) {
  const cuda::Selection chosen = cuda::select_on_device(codec, x, n, residual, arena, stream);
  DevicePayload payload;
  payload.size = cuda::topk_payload_bytes(n, chosen.count);
  payload.data = cuda::payload_memory(arena, payload.size);
  cuda::write_topk_payload(chosen.u, n, chosen.indices, chosen.count, residual, payload.data, stream);
  return payload;
}

void topk_device_decode_add(const uint8_t* payload, const uint8_t* prefix, size_t have, size_t size, float* out,
                            int64_t n, int* error, DeviceArena&, cudaStream_t stream) {
  wire::Reader r(prefix, have, size, "topk");
  const TopKLayout layout = read_topk_layout(r, n);
  if (layout.value_type != ValueType::kFp32) r.fail("compact payloads (coded positions) decode on the host");
  cuda::add_topk(payload + layout.indices.offset, payload + layout.values.offset, static_cast<int64_t>(layout.k),
                 layout.width, out, n, error, stream);
}

// The kernels write and read fp32 values with indices; compact payloads (values=fp16|bf16)
// are the host codec's.
bool topk_device_accepts(const CodecParameters& codec) { return codec.values == ValueType::kFp32; }

}  // namespace

const DeviceHalf kTopKDevice = {topk_device_encode, topk_device_decode_add, topk_device_accepts, nullptr};

}  // namespace gradzip
