#include "codec/topk_codec.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "codec/element_math.cuh"
#include "codec/selection_codec.h"

namespace gradzip {

uint8_t topk_index_width(int64_t n) { return n <= (int64_t{1} << 32) ? 4 : 8; }

TopKLayout topk_layout(uint64_t k, uint8_t width) {
  TopKLayout layout{.k = k, .value_type = ValueType::kFp32, .width = width, .indices = {}, .values = {}, .bytes = 0};
  layout.indices = {kPayloadHeaderBytes + 9, k * width};
  layout.values = {layout.indices.offset + layout.indices.bytes, k * 4};
  layout.bytes = layout.values.offset + layout.values.bytes;
  return layout;
}

TopKLayout compact_topk_layout(uint64_t k, ValueType type, const PositionCoding& positions) {
  TopKLayout layout{.k = k, .value_type = type, .width = 0, .indices = {}, .values = {}, .bytes = 0};
  layout.positions = position_layout(kPayloadHeaderBytes + 10, positions);
  layout.values = {layout.positions.bytes.offset + layout.positions.bytes.bytes, k * 2};
  layout.bytes = layout.values.offset + layout.values.bytes;
  return layout;
}

void write_topk_fields(wire::Writer& w, int64_t n, const TopKLayout& layout) {
  w.header(CodecId::kTopK, static_cast<uint64_t>(n));
  w.put<uint64_t>(layout.k);
  w.put<uint8_t>(layout.width);
  if (layout.width != 0) return;
  w.put<uint8_t>(static_cast<uint8_t>(layout.value_type));
  write_position_header(w, layout.positions.coding());
}

TopKLayout read_topk_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kTopK, n);
  const uint64_t k = r.get_count("k", n);
  const auto width = r.get<uint8_t>("index width");
  TopKLayout layout;
  if (width == 0) {
    const uint8_t type = r.get<uint8_t>("value type");
    if (type != static_cast<uint8_t>(ValueType::kFp16) && type != static_cast<uint8_t>(ValueType::kBf16)) {
      r.fail("value type " + std::to_string(type) + " is neither fp16 (1) nor bf16 (2)");
    }
    layout = compact_topk_layout(k, static_cast<ValueType>(type), read_position_layout(r, n, k).coding());
  } else {
    if (width != 4 && width != 8) {
      r.fail("index width " + std::to_string(width) + " is neither 4 nor 8 (nor 0: coded positions)");
    }
    layout = topk_layout(k, width);
    r.take(layout.indices.bytes, "indices");
  }
  r.take(layout.values.bytes, "values");
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
    const auto most = static_cast<uint64_t>(max_selected(selection(), n));
    if (compact()) {
      return compact_topk_layout(most, parameters_.values, {.bytes = max_position_bytes(n, static_cast<int64_t>(most))})
          .bytes;
    }
    return topk_layout(most, topk_index_width(n)).bytes;
  }

  void decode_entries(const uint8_t* data, size_t size, int64_t n, float scale, Entries& entries) const override {
    wire::Reader r(data, size, "topk");
    const TopKLayout layout = read_topk_layout(r, n);
    const uint8_t* values = r.at(layout.values);
    entries.positions.resize(layout.k);
    entries.values.resize(layout.k);
    if (layout.value_type != ValueType::kFp32) {
      read_positions(r, layout.positions, layout.k, n, entries.positions.data());
      for (uint64_t j = 0; j < layout.k; ++j) {
        uint16_t v;
        std::memcpy(&v, values + 2 * j, 2);
        entries.values[j] = scale * from_wire(layout.value_type, v);
      }
      return;
    }
    const uint8_t* indices = r.at(layout.indices);
    // Every index checked: strictly ascending and below n.
    int64_t previous = -1;
    for (uint64_t j = 0; j < layout.k; ++j) {
      const int64_t index = read_index(indices, j, layout.width);
      if (index <= previous || index >= n) {
        r.fail("index " + std::to_string(index) + " at position " + std::to_string(j) +
               " is out of range or not ascending");
      }
      entries.positions[j] = previous = index;
      float v;
      std::memcpy(&v, values + 4 * j, 4);
      entries.values[j] = scale * v;
    }
  }

 protected:
  // fp32 values go exactly; 2-byte values round each by its own value, which the sums do
  // not tell.
  double chosen_error(int64_t, const MagnitudeSums&) const override {
    return compact() ? std::numeric_limits<double>::quiet_NaN() : 0.0;
  }

  void write(const float* u, int64_t n, const std::vector<int64_t>& chosen,
             std::vector<uint8_t>& out) const override {
    wire::Writer w(out);
    if (compact()) {
      const CodedPositions positions = code_positions(chosen, n);
      const TopKLayout layout = compact_topk_layout(chosen.size(), parameters_.values, positions.coding);
      write_topk_fields(w, n, layout);
      w.put_bytes(positions.bytes);
      uint8_t* values = w.reserve(layout.values.bytes);
      for (size_t j = 0; j < chosen.size(); ++j) {
        const uint16_t v = to_wire(parameters_.values, u[chosen[j]]);
        std::memcpy(values + 2 * j, &v, 2);
      }
      return;
    }
    const TopKLayout layout = topk_layout(chosen.size(), topk_index_width(n));
    const uint8_t width = layout.width;
    write_topk_fields(w, n, layout);
    uint8_t* indices = w.reserve(layout.indices.bytes);
    for (size_t j = 0; j < chosen.size(); ++j) {
      if (width == 4) {
        const uint32_t index = static_cast<uint32_t>(chosen[j]);
        std::memcpy(indices + 4 * j, &index, 4);
      } else {
        std::memcpy(indices + 8 * j, &chosen[j], 8);
      }
    }
    uint8_t* values = w.reserve(layout.values.bytes);
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
