// topk: the k = ceil(density·n) entries of largest magnitude, as (index, value) pairs.
// Body: u64 k, u8 index width (4 or 8 bytes), k ascending indices, k fp32 values.
#include "codec/selection_codec.h"
#include "codec/wire.h"

namespace gradzip {
namespace {

class TopKCodec final : public SelectionCodec {
 public:
  using SelectionCodec::SelectionCodec;
  CodecId id() const override { return CodecId::kTopK; }
  std::string name() const override { return "topk"; }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "topk");
    r.header(id(), n);
    const uint64_t k = r.get_count("k", n);
    const uint8_t width = r.get<uint8_t>("index width");
    if (width != 4 && width != 8) r.fail("index width " + std::to_string(width) + " is neither 4 nor 8");
    const uint8_t* indices = r.take(k * width, "indices");
    const uint8_t* values = r.take(k * 4, "values");
    r.finish();
    // Check every index before writing any: strictly ascending and below n.
    int64_t previous = -1;
    for (uint64_t j = 0; j < k; ++j) {
      const int64_t index = read_index(indices, j, width);
      if (index <= previous || index >= n) {
        r.fail("index " + std::to_string(index) + " at position " + std::to_string(j) +
               " is out of range or not ascending");
      }
      previous = index;
    }
    for (uint64_t j = 0; j < k; ++j) {
      float v;
      std::memcpy(&v, values + 4 * j, 4);
      out[read_index(indices, j, width)] += scale * v;
    }
  }

 protected:
  void write(const float* u, int64_t n, const std::vector<int64_t>& chosen,
             std::vector<uint8_t>& out) const override {
    const uint8_t width = n <= (int64_t{1} << 32) ? 4 : 8;
    wire::Writer w(out);
    w.header(id(), n);
    w.put<uint64_t>(chosen.size());
    w.put<uint8_t>(width);
    uint8_t* indices = w.reserve(chosen.size() * width);
    for (size_t j = 0; j < chosen.size(); ++j) {
      if (width == 4) {
        const uint32_t index = static_cast<uint32_t>(chosen[j]);
        std::memcpy(indices + 4 * j, &index, 4);
      } else {
        std::memcpy(indices + 8 * j, &chosen[j], 8);
      }
    }
    uint8_t* values = w.reserve(chosen.size() * 4);
    for (size_t j = 0; j < chosen.size(); ++j) std::memcpy(values + 4 * j, u + chosen[j], 4);
  }


 private:
  static int64_t read_index(const uint8_t* indices, uint64_t j, uint8_t width) {
    if (width == 4) {
      uint32_t index;
      std::memcpy(&index, indices + 4 * j, 4);
      return index;
    }
    uint64_t index;
    std::memcpy(&index, indices + 8 * j, 8);
    return index > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(index);
  }
};

}  // namespace

std::unique_ptr<Codec> make_topk_codec(double density, bool approx) {
  return std::make_unique<TopKCodec>(density, approx);
}

}  // namespace gradzip
