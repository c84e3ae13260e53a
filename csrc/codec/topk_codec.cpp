#include "codec/topk_codec.h"

#include "codec/selection_codec.h"

namespace gradzip {

TopKLayout read_topk_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kTopK, n);
  TopKLayout layout;
  layout.k = r.get_count("k", n);
  layout.width = r.get<uint8_t>("index width");
  if (layout.width != 4 && layout.width != 8) {
    r.fail("index width " + std::to_string(layout.width) + " is neither 4 nor 8");
  }
  layout.indices = r.take(layout.k * layout.width, "indices");
  layout.values = r.take(layout.k * 4, "values");
  r.finish();
  return layout;
}

namespace {

class TopKCodec final : public SelectionCodec {
 public:
  using SelectionCodec::SelectionCodec;
  size_t max_payload_bytes(int64_t n) const override {
    const size_t width = n <= (int64_t{1} << 32) ? 4 : 8;
    return kPayloadHeaderBytes + 9 + static_cast<size_t>(max_selected(parameters_, n)) * (width + 4);
  }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "topk");
    const TopKLayout layout = read_topk_layout(r, n);
    const uint8_t* indices = r.at(layout.indices);
    const uint8_t* values = r.at(layout.values);
    // Check every index before writing any: strictly ascending and below n.
    int64_t previous = -1;
    for (uint64_t j = 0; j < layout.k; ++j) {
      const int64_t index = read_index(indices, j, layout.width);
      if (index <= previous || index >= n) {
        r.fail("index " + std::to_string(index) + " at position " + std::to_string(j) +
               " is out of range or not ascending");
      }
      previous = index;
    }
    for (uint64_t j = 0; j < layout.k; ++j) {
      float v;
      std::memcpy(&v, values + 4 * j, 4);
      out[read_index(indices, j, layout.width)] += scale * v;
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

const CodecRecord& topk_record() {
  static const CodecRecord record =
      selection_record<CodecId::kTopK, TopKCodec>(
      "topk", "the ceil(density·n) largest magnitudes as (index, value); approx=1 estimates the threshold",
      GRADZIP_DEVICE_HALF(kTopKDevice));
  return record;
}

}  // namespace gradzip
