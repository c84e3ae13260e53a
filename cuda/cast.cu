// identity, fp16 and bf16 on the GPU: one thread per element makes u = x (+ residual),
// writes it as fp32, IEEE half or bfloat16 after the header (the host's element math,
// round to nearest even), and with error feedback leaves the residual u − sent, as the
// host codec does (residual + (−1 · sent)). Decode adds each value into the sum.
#include "codec/cast_codecs.h"
#include "codec/codec_record.h"
#include "codec/element_math.cuh"
#include "codec/wire.h"
#include "cuda_check.h"
#include "payload_memory.cuh"
#include "payload_rows.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

template <CodecId kId>
__device__ __forceinline__ float stored(uint8_t* values, int64_t i, float u) {
  if constexpr (kId == CodecId::kIdentity) {
    reinterpret_cast<float*>(values)[i] = u;
    return u;
  } else if constexpr (kId == CodecId::kFp16) {
    const uint16_t h = math::float_to_half(u);
    reinterpret_cast<uint16_t*>(values)[i] = h;
    return math::half_to_float(h);
  } else {
    const uint16_t b = math::float_to_bf16(u);
    reinterpret_cast<uint16_t*>(values)[i] = b;
    return math::bf16_to_float(b);
  }
}

template <CodecId kId>
__device__ __forceinline__ float loaded(const uint8_t* values, int64_t i) {
  if constexpr (kId == CodecId::kIdentity) {
    return reinterpret_cast<const float*>(values)[i];
  } else if constexpr (kId == CodecId::kFp16) {
    return math::half_to_float(reinterpret_cast<const uint16_t*>(values)[i]);
  } else {
    return math::bf16_to_float(reinterpret_cast<const uint16_t*>(values)[i]);
  }
}

template <CodecId kId>
__global__ void __launch_bounds__(kThreads) cast_encode(const float* x, float* residual, int64_t n, uint8_t* values) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float u = residual ? residual[i] + x[i] : x[i];
  const float sent = stored<kId>(values, i, u);
  if (residual) residual[i] = u + -1.0f * sent;
}

// `count` payloads at payloads + r·stride, their values at `values_at` in each: each
// element's scaled values added in row order, as the host's out[i] += scale · value.
template <CodecId kId>
__global__ void __launch_bounds__(kThreads) cast_add_rows(const uint8_t* payloads, size_t stride, int count,
                                                          uint64_t values_at, float scale, bool set, int64_t n,
                                                          float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sum = set ? 0.0f : out[i];
  for (int r = 0; r < count; ++r) sum += scale * loaded<kId>(payloads + static_cast<size_t>(r) * stride + values_at, i);
  out[i] = sum;
}

constexpr size_t value_bytes(CodecId id) { return id == CodecId::kIdentity ? 4 : 2; }

}  // namespace
}  // namespace gradzip::cuda

namespace gradzip {
namespace {

template <CodecId kId>
DevicePayload cast_device_encode(const Codec&, const float* x, int64_t n, float* residual,
                                 const EncodeContext&, DeviceArena& arena, cudaStream_t stream) {
  DevicePayload payload;
  payload.size = kPayloadHeaderBytes + static_cast<size_t>(n) * cuda::value_bytes(kId);
  payload.data = cuda::payload_memory(arena, payload.size);
  std::vector<uint8_t> fields;
  wire::Writer w(fields);
  w.header(kId, static_cast<uint64_t>(n));
  cuda::write_fixed_fields(payload.data, fields, stream);
  if (n > 0) {
    cuda::cast_encode<kId><<<cuda::blocks_for(n, cuda::kThreads), cuda::kThreads, 0, stream>>>(
        x, residual, n, payload.data + kPayloadHeaderBytes);
    cuda::check_launch("cast_encode");
  }
  return payload;
}

template <CodecId kId>
bool cast_device_decode_rows(const PayloadRows& rows, float scale, bool set, float* out, int64_t n, int*,
                             cudaStream_t stream) {
  const auto layouts = cuda::row_layouts(rows, n, codec_record(kId).name.c_str(), [](wire::Reader& r, int64_t n) {
    return read_cast_layout(r, kId, n).offset;
  });
  if (!cuda::laid_out_alike(layouts, [](uint64_t values_at) { return values_at; })) return false;
  if (n <= 0) return true;
  cuda::cast_add_rows<kId><<<cuda::blocks_for(n, cuda::kThreads), cuda::kThreads, 0, stream>>>(
      rows.data, rows.stride, static_cast<int>(layouts.size()), layouts.front(), scale, set, n, out);
  cuda::check_launch("cast_add_rows");
  return true;
}

template <CodecId kId>
constexpr DeviceHalf cast_device_half() {
  return {cast_device_encode<kId>, cuda::decode_add_as_one_row<cast_device_decode_rows<kId>>, nullptr,
          cast_device_decode_rows<kId>};
}

}  // namespace

const DeviceHalf kIdentityDevice = cast_device_half<CodecId::kIdentity>();
const DeviceHalf kFp16Device = cast_device_half<CodecId::kFp16>();
const DeviceHalf kBf16Device = cast_device_half<CodecId::kBf16>();

}  // namespace gradzip
