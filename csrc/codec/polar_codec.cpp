#include "codec/polar_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "codec/bitpack.h"
#include "codec/codec_base.h"
#include "codec/polar_code.h"
#include "codec/wire.h"

namespace gradzip {
namespace {

constexpr uint32_t kMaxBlock = 1u << 16;

// The frozen set of (m, K), designed once: a few milliseconds at m = 12, 60 ms at 16. The
// 64 most recently used are kept, so a payload with unusual parameters (a hostile one
// cycling through K) costs its own design but cannot evict the sets in steady use for
// long, nor grow the cache.
std::shared_ptr<const std::vector<uint8_t>> frozen_set(int m, uint32_t free) {
  using Key = std::pair<int, uint32_t>;
  struct Entry {
    std::shared_ptr<const std::vector<uint8_t>> mask;
    uint64_t used;
  };
  static std::mutex mutex;
  static std::map<Key, Entry> cache;
  static uint64_t clock = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto found = cache.find({m, free}); found != cache.end()) {
      found->second.used = ++clock;
      return found->second.mask;
    }
  }
  auto mask = std::make_shared<const std::vector<uint8_t>>(polar::frozen_mask(m, static_cast<int>(free)));
  const std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= 64) {
    cache.erase(std::min_element(cache.begin(), cache.end(),
                                 [](const auto& a, const auto& b) { return a.second.used < b.second.used; }));
  }
  cache[{m, free}] = Entry{mask, ++clock};
  return mask;
}

// One block's shape: its elements, its code length 2^m and its free bits.
struct BlockShape {
  int64_t length;
  int m;
  uint32_t free;
};

BlockShape block_shape(int64_t n, uint32_t block, uint32_t free, int64_t b) {
  const int64_t begin = b * block;
  const int64_t length = std::min<int64_t>(block, n - begin);
  if (length == block) return {length, std::countr_zero(block), free};
  const int m = static_cast<int>(std::bit_width(static_cast<uint64_t>(length - 1)));  // 2^m ≥ length
  const uint64_t size = uint64_t{1} << m;
  return {length, m, static_cast<uint32_t>((uint64_t{free} * size + block - 1) / block)};
}

uint64_t total_free_bits(int64_t n, uint32_t block, uint32_t free) {
  if (n == 0) return 0;
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<uint64_t>(blocks - 1) * free + block_shape(n, block, free, blocks - 1).free;
}

struct PolarLayout {
  uint32_t block, free;
  int64_t blocks;
  wire::Section scales, bits;
};

PolarLayout read_polar_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kPolar, n);
  PolarLayout layout;
  layout.block = r.get<uint32_t>("block");
  if (layout.block < 2 || layout.block > kMaxBlock || !std::has_single_bit(layout.block)) {
    r.fail("block " + std::to_string(layout.block) + " is not a power of two in [2, " + std::to_string(kMaxBlock) + "]");
  }
  layout.free = r.get<uint32_t>("free bits");
  if (layout.free > layout.block) {
    r.fail(std::to_string(layout.free) + " free bits in a block of " + std::to_string(layout.block));
  }
  layout.blocks = (n + layout.block - 1) / layout.block;
  layout.scales = r.take(static_cast<uint64_t>(layout.blocks) * 4, "block scales");
  layout.bits = r.take(wire::bytes_for_bits(total_free_bits(n, layout.block, layout.free)), "free bits");
  r.finish();
  return layout;
}

struct PolarParameters {
  int64_t block = 0;  // elements per code block, a power of two
  double rate = 0.0;  // free bits per sign
  int list_size = 1;  // successive-cancellation list size
};

class PolarCodec final : public ValueCodec {
 public:
  // any_shape: decode the block and free bits a payload states (codec_for_payload),
  // rather than refuse a payload coded otherwise than `p`.
  PolarCodec(const PolarParameters& p, bool any_shape)
      : ValueCodec(CodecId::kPolar),
        block_(static_cast<uint32_t>(p.block)),
        free_(static_cast<uint32_t>(std::llround(p.rate * static_cast<double>(p.block)))),
        list_size_(p.list_size),
        any_shape_(any_shape) {}
  bool biased() const override { return true; }
  size_t max_payload_bytes(int64_t n) const override {
    const uint64_t blocks = (static_cast<uint64_t>(n) + block_ - 1) / block_;
    return kPayloadHeaderBytes + 8 + blocks * 4 + wire::bytes_for_bits(total_free_bits(n, block_, free_));
  }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "polar");
    const PolarLayout layout = read_polar_layout(r, n);
    if (!any_shape_ && (layout.block != block_ || layout.free != free_)) {
      r.fail("coded in blocks of " + std::to_string(layout.block) + " with " + std::to_string(layout.free) +
             " free bits, not this spec's " + std::to_string(block_) + " with " + std::to_string(free_));
    }
    const uint8_t* scales = r.at(layout.scales);
    bitpack::BitReader bits(r.at(layout.bits), layout.bits.bytes);
    std::vector<uint8_t> free_bits, signs;
    for (int64_t b = 0; b < layout.blocks; ++b) {
      const BlockShape shape = block_shape(n, layout.block, layout.free, b);
      free_bits.resize(shape.free);
      for (auto& bit : free_bits) bit = static_cast<uint8_t>(bits.get(1));
      signs.resize(size_t{1} << shape.m);
      polar::decode(free_bits.data(), shape.m, frozen_set(shape.m, shape.free)->data(), signs.data());
      float s;
      std::memcpy(&s, scales + 4 * b, 4);
      const float plus = scale * s, minus = scale * -s;
      float* o = out + b * layout.block;
      for (int64_t i = 0; i < shape.length; ++i) o[i] += signs[i] ? plus : minus;
    }
    if (bits.failed()) r.fail("the free bits end early");
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const override {
    wire::Writer w(out);
    w.header(id(), n);
    w.put<uint32_t>(block_);
    w.put<uint32_t>(free_);
    const int64_t blocks = (n + block_ - 1) / block_;
    const size_t scales_at = out.size();
    w.reserve(static_cast<size_t>(blocks) * 4);
    std::vector<uint8_t> packed;
    bitpack::BitWriter bits(packed);
    std::vector<uint8_t> source, free_bits, signs;
    std::unique_ptr<polar::Encoder> encoder;
    int encoder_m = -1;
    for (int64_t b = 0; b < blocks; ++b) {
      const BlockShape shape = block_shape(n, block_, free_, b);
      const float* x = u + b * block_;
      const size_t size = size_t{1} << shape.m;
      source.assign(size, 0);  // the padding of a last partial block: zeros
      for (int64_t i = 0; i < shape.length; ++i) source[i] = std::signbit(x[i]) ? 0 : 1;
      if (shape.m != encoder_m) encoder = std::make_unique<polar::Encoder>(shape.m, list_size_), encoder_m = shape.m;
      const auto frozen = frozen_set(shape.m, shape.free);
      free_bits.resize(shape.free);
      encoder->encode(source.data(), frozen->data(), free_bits.data());
      signs.resize(size);
      polar::decode(free_bits.data(), shape.m, frozen->data(), signs.data());
      double sum = 0.0;  // the least-squares scale for the decoded signs, summed in order
      for (int64_t i = 0; i < shape.length; ++i) {
        const double magnitude = std::fabs(static_cast<double>(x[i]));
        sum += signs[i] == source[i] ? magnitude : -magnitude;
      }
      const float s = static_cast<float>(sum / static_cast<double>(shape.length));
      std::memcpy(out.data() + scales_at + 4 * b, &s, 4);
      for (uint8_t bit : free_bits) bits.put(bit, 1);
    }
    bits.flush();
    if (!packed.empty()) std::memcpy(w.reserve(packed.size()), packed.data(), packed.size());
  }

 private:
  uint32_t block_;
  uint32_t free_;
  int list_size_;
  bool any_shape_;
};

PolarParameters parse_polar(const Spec& spec) {
  const PolarParameters p{.block = spec.get_int("block"),
                          .rate = spec.get_double("rate"),
                          .list_size = static_cast<int>(spec.get_int("list"))};
  if (!(p.rate > 0.0)) throw SpecError("gradzip: spec '" + spec.str() + "': rate must be above 0");
  if (!std::has_single_bit(static_cast<uint64_t>(p.block))) {
    throw SpecError("gradzip: spec '" + spec.str() + "': block must be a power of two, got " + std::to_string(p.block));
  }
  return p;
}

}  // namespace

const CodecRecord& polar_record() {
  static const CodecRecord record = {
      CodecId::kPolar,
      "polar",
      "signs by polar lossy source coding at a rate (bits per sign), a least-squares scale per block",
      {SpecKey::number("rate", "0.5", 0.0, 1.0, "free bits per sign: the code rate R in (0, 1]"),
       SpecKey::integer("block", "4096", 2, kMaxBlock, "elements per polar block (a power of two)"),
       SpecKey::integer("list", "1", 1, 8, "successive-cancellation list size: larger is closer to the bound, slower")},
      [](const Spec& spec) -> std::unique_ptr<Codec> { return std::make_unique<PolarCodec>(parse_polar(spec), false); },
      nullptr,
      [] {
        Spec defaults{"polar", {}, {}};
        fill_defaults(defaults, polar_record().keys);
        return std::unique_ptr<Codec>(std::make_unique<PolarCodec>(parse_polar(defaults), true));
      },
  };
  return record;
}

}  // namespace gradzip
