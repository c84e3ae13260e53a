#include "codec/topk_codec.h"

#include <algorithm>

#include "codec/element_math.cuh"
#include "codec/selection_codec.h"

namespace gradzip {

TopKLayout read_topk_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kTopK, n);
  TopKLayout layout;
  layout.k = r.get_count("k", n);
  layout.width = r.get<uint8_t>("index width");
  if (layout.width == 0) {
    const uint8_t type = r.get<uint8_t>("value type");
    if (type != static_cast<uint8_t>(ValueType::kFp16) && type != static_cast<uint8_t>(ValueType::kBf16)) {
      r.fail("value type " + std::to_string(type) + " is neither fp16 (1) nor bf16 (2)");
    }
    layout.value_type = static_cast<ValueType>(type);
    layout.positions = read_position_layout(r, n, layout.k);
    layout.values = r.take(layout.k * 2, "values");
  } else {
    if (layout.width != 4 && layout.width != 8) {
      r.fail("index width " + std::to_string(layout.width) + " is neither 4 nor 8 (nor 0: coded positions)");
    }
    layout.value_type = ValueType::kFp32;
    layout.indices = r.take(layout.k * layout.width, "indices");
    layout.values = r.take(layout.k * 4, "values");
  }
  r.finish();
  return layout;
}

namespace {

// The element math's, shared with the CUDA encoder (saturating, not Inf).
uint16_t to_wire(ValueType type, float v) { return math::compact_value_bits(v, type == ValueType::kFp16); }
float from_wire(ValueType type, uint16_t v) { return math::compact_value(v, type == ValueType::kFp16); }

class TopKCodec final : public SelectionCodec<TopKCodec, TopKParameters> {
 public:
  explicit TopKCodec(const TopKParameters& parameters) : SelectionCodec(CodecId::kTopK, parameters) {}
  size_t max_payload_bytes(int64_t n) const override {
    const auto most = static_cast<size_t>(max_selected(selection(), n));
    if (compact()) return kPayloadHeaderBytes + 10 + kPositionHeaderBytes + max_position_bytes(n, most) + 2 * most;
    const size_t width = n <= (int64_t{1} << 32) ? 4 : 8;
    return kPayloadHeaderBytes + 9 + most * (width + 4);
  }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "topk");
    const TopKLayout layout = read_topk_layout(r, n);
    const uint8_t* values = r.at(layout.values);
    if (layout.value_type != ValueType::kFp32) {
      std::vector<int64_t> indices;
      read_positions(r, layout.positions, layout.k, n, indices);  // checked before anything is written
      for (uint64_t j = 0; j < layout.k; ++j) {
        uint16_t v;
        std::memcpy(&v, values + 2 * j, 2);
        out[indices[j]] += scale * from_wire(layout.value_type, v);
      }
      return;
    }
    const uint8_t* indices = r.at(layout.indices);
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
    wire::Writer w(out);
    w.header(id(), n);
    w.put<uint64_t>(chosen.size());
    if (compact()) {
      w.put<uint8_t>(0);
      w.put<uint8_t>(static_cast<uint8_t>(parameters_.values));
      write_positions(w, chosen, n);
      uint8_t* values = w.reserve(chosen.size() * 2);
      for (size_t j = 0; j < chosen.size(); ++j) {
        const uint16_t v = to_wire(parameters_.values, u[chosen[j]]);
        std::memcpy(values + 2 * j, &v, 2);
      }
      return;
    }
    const uint8_t width = n <= (int64_t{1} << 32) ? 4 : 8;
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
  bool compact() const { return parameters_.values != ValueType::kFp32; }

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

TopKParameters parse_topk(const Spec& spec) {
  const std::string values = spec.get_string("values");
  return {.selection = parse_selection(spec),
          .values = values == "fp16" ? ValueType::kFp16 : values == "bf16" ? ValueType::kBf16 : ValueType::kFp32};
}

}  // namespace

const TopKParameters& topk_parameters(const Codec& codec) { return parameters_of<TopKParameters>(codec); }

const CodecRecord& topk_record() {
  static const CodecRecord record = [] {
    CodecRecord r = selection_record<CodecId::kTopK, TopKCodec, parse_topk>(
        "topk", "the ceil(density·n) largest magnitudes as (position, value); approx=1 estimates the threshold",
        GRADZIP_DEVICE_HALF(kTopKDevice));
    r.keys.push_back(SpecKey::choice("values", "fp32", {"fp32", "fp16", "bf16"},
                                     "fp32: values with 4- or 8-byte indices; fp16, bf16: 2-byte values with "
                                     "Golomb-Rice coded positions (error feedback keeps the rounding)"));
    return r;
  }();
  return record;
}

}  // namespace gradzip
