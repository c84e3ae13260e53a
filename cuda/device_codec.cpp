// The codecs on the device: host orchestration of the kernels in cuda/*.cu, and the
// host-side checks of each payload's fixed fields and section lengths.
#include "device_codec.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "codec/wire.h"
#include "cuda_check.h"
#include "decode_accumulate.h"
#include "encoders.h"
#include "topk_select.h"

namespace gradzip::cuda {
namespace {

size_t round8(size_t bytes) { return (bytes + 7) / 8 * 8; }

uint8_t* payload_memory(DeviceArena& arena, size_t size) {
  return static_cast<uint8_t*>(arena.allocate(std::max<size_t>(round8(size), 8)));
}

DevicePayload encode_selection(const CodecParameters& codec, const float* x, int64_t n, float* residual,
                               DeviceArena& arena, cudaStream_t stream) {
  const int64_t k = count_for_density(codec.density, n);
  void* scratch = arena.allocate(topk_scratch_bytes(n));
  const int64_t count = topk_prepare(x, residual, n, k, codec.approx, scratch, stream);
  auto* indices = static_cast<int64_t*>(arena.allocate(8 * static_cast<size_t>(std::max<int64_t>(count, 1))));
  const float* u = residual ? residual : x;
  if (count > 0) topk_compact(u, n, indices, scratch, stream);
  DevicePayload payload;
  if (codec.id == CodecId::kTopK) {
    payload.size = topk_payload_bytes(n, count);
    payload.data = payload_memory(arena, payload.size);
    write_topk_payload(u, n, indices, count, residual, payload.data, stream);
    return payload;
  }
  void* stc_scratch = arena.allocate(stc_scratch_bytes(n, count));
  const StcPlan plan = stc_plan(n, indices, count, stc_scratch, stream);
  payload.size = plan.payload_bytes;
  payload.data = payload_memory(arena, payload.size);
  write_stc_payload(plan, u, n, indices, count, residual, payload.data, stc_scratch, stream);
  return payload;
}

// The fixed fields of one payload, read from its first bytes copied to the host, and
// its sections' offsets; the same checks and messages as wire::Reader.
class Fields {
 public:
  Fields(const uint8_t* prefix, size_t have, size_t size, const char* codec)
      : prefix_(prefix), have_(have), size_(size), codec_(codec) {}

  void header(CodecId codec, int64_t n) {
    const PayloadHeader h = read_payload_header(prefix_, std::min(have_, size_));
    if (h.codec != codec) {
      fail("a payload of codec id " + std::to_string(static_cast<int>(h.codec)) + " given to the " + codec_ +
           " decoder");
    }
    if (h.numel != static_cast<uint64_t>(n)) {
      fail("the payload holds " + std::to_string(h.numel) + " elements, the output has " + std::to_string(n));
    }
    at_ = kPayloadHeaderBytes;
  }
  template <typename T>
  T get(const char* field) {
    need(sizeof(T), field);
    if (at_ + sizeof(T) > have_) throw std::logic_error("gradzip: fixed payload fields beyond the copied prefix");
    T value;
    std::memcpy(&value, prefix_ + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  uint64_t get_count(const char* field, int64_t n) {
    const uint64_t k = get<uint64_t>(field);
    if (k > static_cast<uint64_t>(n)) {
      fail(std::string(field) + " = " + std::to_string(k) + " exceeds the " + std::to_string(n) + " elements");
    }
    return k;
  }
  // The offset of the next `bytes` bytes.
  size_t take(uint64_t bytes, const char* field) {
    need(bytes, field);
    const size_t at = at_;
    at_ += bytes;
    return at;
  }
  void finish() const {
    if (at_ != size_) fail(std::to_string(size_ - at_) + " bytes left over after the last section");
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw PayloadError(std::string("gradzip: invalid ") + codec_ + " payload: " + why);
  }

 private:
  void need(uint64_t bytes, const char* field) const {
    if (bytes > size_ - at_) {
      fail(std::string("truncated: ") + field + " needs " + std::to_string(bytes) + " bytes at offset " +
           std::to_string(at_) + ", only " + std::to_string(size_ - at_) + " left");
    }
  }

  const uint8_t* prefix_;
  size_t have_, size_, at_ = 0;
  const char* codec_;
};

constexpr size_t kPrefixBytes = 64;  // covers every codec's fixed fields

int qsgd_width_for(uint32_t levels) { return qsgd_code_width(static_cast<int>(levels)); }

// Checks one payload's fixed fields and section lengths on the host and queues its kernels.
void queue_decode(CodecId codec, const uint8_t* payload, const uint8_t* prefix, size_t have, size_t size, float* out,
                  int64_t n, int* error, DeviceArena& arena, cudaStream_t stream) {
  switch (codec) {
    case CodecId::kTopK: {
      Fields f(prefix, have, size, "topk");
      f.header(codec, n);
      const uint64_t k = f.get_count("k", n);
      const uint8_t width = f.get<uint8_t>("index width");
      if (width != 4 && width != 8) f.fail("index width " + std::to_string(width) + " is neither 4 nor 8");
      const size_t indices = f.take(k * width, "indices");
      const size_t values = f.take(k * 4, "values");
      f.finish();
      return add_topk(payload + indices, payload + values, static_cast<int64_t>(k), width, out, n, error, stream);
    }
    case CodecId::kStc: {
      Fields f(prefix, have, size, "stc");
      f.header(codec, n);
      const uint64_t k = f.get_count("k", n);
      const float mu = f.get<float>("mu");
      const uint8_t coding = f.get<uint8_t>("position coding");
      const int b = f.get<uint8_t>("golomb parameter");
      const uint64_t position_bytes = f.get<uint64_t>("position bytes");
      if (coding != 0 && coding != 1) f.fail("unknown position coding " + std::to_string(coding));
      if (b > kMaxGolombParameter) {
        f.fail("golomb parameter " + std::to_string(b) + " above " + std::to_string(kMaxGolombParameter));
      }
      const size_t positions = f.take(position_bytes, "positions");
      const size_t signs = f.take(wire::bytes_for_bits(k), "sign bits");
      f.finish();
      if (coding == 1 && position_bytes != wire::bytes_for_bits(static_cast<uint64_t>(n))) {
        f.fail("the bitmap is not ceil(n/8) bytes");
      }
      if (coding == 0 && k == 0 && position_bytes != 0) f.fail("position bytes left over");
      void* scratch = arena.allocate(stc_decode_scratch_bytes(n, static_cast<int64_t>(k), position_bytes));
      return add_stc(payload + positions, position_bytes, coding == 1, b, payload + signs, static_cast<int64_t>(k), mu,
                     out, n, error, scratch, stream);
    }
    case CodecId::kSign: {
      Fields f(prefix, have, size, "sign");
      f.header(codec, n);
      const uint32_t block = f.get<uint32_t>("block");
      const uint64_t blocks = block ? (static_cast<uint64_t>(n) + block - 1) / block : 0;
      const size_t scales = f.take(blocks * 4, "block scales");
      const size_t bits = f.take(wire::bytes_for_bits(static_cast<uint64_t>(n)), "sign bits");
      f.finish();
      return add_sign(reinterpret_cast<const float*>(payload + scales), reinterpret_cast<const uint32_t*>(payload + bits),
                      block, out, n, stream);
    }
    case CodecId::kQsgd: {
      Fields f(prefix, have, size, "qsgd");
      f.header(codec, n);
      const int width = f.get<uint8_t>("code width");
      const uint32_t levels = f.get<uint16_t>("levels");
      const uint8_t norm = f.get<uint8_t>("norm");
      const uint32_t bucket = f.get<uint32_t>("bucket");
      if (levels < 1 || levels > 32767 || width != qsgd_width_for(levels)) {
        f.fail("levels " + std::to_string(levels) + " with code width " + std::to_string(width));
      }
      if (norm > 1) f.fail("unknown norm " + std::to_string(norm));
      if (bucket == 0) f.fail("bucket size 0");
      const uint64_t buckets = (static_cast<uint64_t>(n) + bucket - 1) / bucket;
      const size_t norms = f.take(buckets * 4, "bucket norms");
      const size_t codes = f.take(wire::bytes_for_bits(static_cast<uint64_t>(n) * width), "codes");
      f.finish();
      return add_qsgd(reinterpret_cast<const float*>(payload + norms), reinterpret_cast<const uint32_t*>(payload + codes),
                      width, levels, bucket, out, n, error, stream);
    }
    default:
      throw std::logic_error("gradzip: no GPU decoder for this codec");
  }
}

std::string device_check_message(CodecId codec, int bits) {
  std::string why;
  if (bits & kBadIndex) why = "an index is out of range or not ascending";
  if (bits & kBadPositions) why = "the positions do not decode to k positions inside the tensor";
  if (bits & kBadLevel) why = "a level is above the number of levels";
  const char* name = codec == CodecId::kTopK ? "topk" : codec == CodecId::kStc ? "stc" : "qsgd";
  return std::string("gradzip: invalid ") + name + " payload: " + why;
}

}  // namespace

bool has_device_codec(CodecId id) {
  return id == CodecId::kTopK || id == CodecId::kStc || id == CodecId::kSign || id == CodecId::kQsgd;
}

DevicePayload device_encode(const CodecParameters& codec, const float* x, int64_t n, float* residual,
                            const EncodeContext& ctx, DeviceArena& arena, cudaStream_t stream) {
  DevicePayload payload;
  switch (codec.id) {
    case CodecId::kTopK:
    case CodecId::kStc:
      return encode_selection(codec, x, n, residual, arena, stream);
    case CodecId::kSign:
      payload.size = sign_payload_bytes(n, codec.block);
      payload.data = payload_memory(arena, payload.size);
      encode_sign(x, residual, n, codec.block, payload.data, stream);
      return payload;
    case CodecId::kQsgd:
      payload.size = qsgd_payload_bytes(n, codec.levels, codec.bucket);
      payload.data = payload_memory(arena, payload.size);
      encode_qsgd(x, residual, n, codec.levels, codec.bucket, codec.max_norm, ctx.seed, ctx.step, ctx.rank,
                  payload.data, stream);
      return payload;
    default:
      throw std::logic_error("gradzip: no GPU encoder for this codec");
  }
}

void device_decode_add(CodecId codec, const uint8_t* payloads, size_t stride, const std::vector<size_t>& sizes,
                       float* out, int64_t n, DeviceArena& arena, cudaStream_t stream) {
  const int count = static_cast<int>(sizes.size());
  if (count == 0) return;
  if (stride % 8 != 0) throw std::logic_error("gradzip: payload stride must be a multiple of 8");
  const size_t have = std::min(kPrefixBytes, stride);
  std::vector<uint8_t> prefixes(kPrefixBytes * count, 0);
  check(cudaMemcpy2DAsync(prefixes.data(), kPrefixBytes, payloads, stride, have, count, cudaMemcpyDeviceToHost, stream),
        "reading the payload headers");
  auto* errors = static_cast<int*>(arena.allocate(sizeof(int) * count));
  check(cudaMemsetAsync(errors, 0, sizeof(int) * count, stream), "clearing the payload checks");
  check(cudaStreamSynchronize(stream), "payload headers");
  for (int r = 0; r < count; ++r) {
    try {
      queue_decode(codec, payloads + r * stride, prefixes.data() + r * kPrefixBytes, std::min(have, sizes[r]), sizes[r],
                   out, n, errors + r, arena, stream);
    } catch (const PayloadError& e) {
      throw RankPayloadError(r, e.what());
    }
  }
  std::vector<int> verdict(count);
  check(cudaMemcpyAsync(verdict.data(), errors, sizeof(int) * count, cudaMemcpyDeviceToHost, stream),
        "reading the payload checks");
  check(cudaStreamSynchronize(stream), "decode-accumulate");
  for (int r = 0; r < count; ++r) {
    if (verdict[r]) throw RankPayloadError(r, device_check_message(codec, verdict[r]));
  }
}

}  // namespace gradzip::cuda
