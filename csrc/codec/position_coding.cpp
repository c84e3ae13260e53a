#include "codec/position_coding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codec/bitpack.h"

namespace gradzip {

int golomb_parameter(int64_t k, int64_t n) {
  const double p = static_cast<double>(k) / static_cast<double>(n);
  if (p >= 1.0 || k == 0) return 0;
  const double phi = (1.0 + std::sqrt(5.0)) / 2.0;
  const double b = 1.0 + std::floor(std::log2(std::log(phi - 1.0) / std::log1p(-p)));
  return b < 0 ? 0 : b > kMaxGolombParameter ? kMaxGolombParameter : static_cast<int>(b);
}

// k gaps add up to at most n − k; with parameter b they take Σ(⌊g/2^b⌋ + 1 + b) ≤
// ⌊(n − k)/2^b⌋ + k(1 + b) bits. That grows with k for a fixed b, and b only falls as k
// grows (k ≥ 1), so the largest k of each b (b takes at most 41 values) bounds all the
// others. No positions take no bytes.
uint64_t max_position_bytes(int64_t n, int64_t max_k) {
  const auto bound = [n](int64_t k, int b) {
    return wire::bytes_for_bits((static_cast<uint64_t>(n - k) >> b) + static_cast<uint64_t>(k) * (1 + b));
  };
  uint64_t most = 0;
  for (int64_t k = max_k; k >= 1;) {
    const int b = golomb_parameter(k, n);
    most = std::max(most, bound(k, b));
    int64_t low = 1, high = k;  // the smallest k' with the same b
    while (low < high) {
      const int64_t mid = low + (high - low) / 2;
      if (golomb_parameter(mid, n) == b) {
        high = mid;
      } else {
        low = mid + 1;
      }
    }
    k = low - 1;
  }
  return std::min<uint64_t>(most, wire::bytes_for_bits(n));
}

CodedPositions code_positions(const std::vector<int64_t>& chosen, int64_t n) {
  const int b = golomb_parameter(static_cast<int64_t>(chosen.size()), n);
  CodedPositions coded;
  std::vector<uint8_t>& golomb = coded.bytes;
  bitpack::BitWriter bits(golomb);
  int64_t previous = -1;
  for (int64_t i : chosen) {
    const uint64_t gap = static_cast<uint64_t>(i - previous - 1);
    bits.put_ones(gap >> b);
    bits.put(0, 1);
    if (b) bits.put(gap & ((uint64_t{1} << b) - 1), b);
    previous = i;
  }
  bits.flush();
  coded.coding.golomb_parameter = b;
  coded.coding.bitmap = golomb.size() > wire::bytes_for_bits(n);
  if (coded.coding.bitmap) {
    coded.bytes.assign(wire::bytes_for_bits(n), 0);
    for (int64_t i : chosen) coded.bytes[static_cast<size_t>(i / 8)] |= static_cast<uint8_t>(1u << (i % 8));
  }
  coded.coding.bytes = coded.bytes.size();
  return coded;
}

void write_position_header(wire::Writer& w, const PositionCoding& coding) {
  w.put<uint8_t>(coding.bitmap ? kBitmapPositions : kGolombPositions);
  w.put<uint8_t>(static_cast<uint8_t>(coding.golomb_parameter));
  w.put<uint64_t>(coding.bytes);
}

PositionLayout position_layout(uint64_t at, const PositionCoding& coding) {
  return {coding.bitmap, coding.golomb_parameter, {at + kPositionHeaderBytes, coding.bytes}};
}

PositionLayout read_position_layout(wire::Reader& r, int64_t n, uint64_t k) {
  const uint8_t coding = r.get<uint8_t>("position coding");
  PositionLayout layout;
  layout.golomb_parameter = r.get<uint8_t>("golomb parameter");
  const uint64_t position_bytes = r.get<uint64_t>("position bytes");
  if (coding != kGolombPositions && coding != kBitmapPositions) {
    r.fail("unknown position coding " + std::to_string(coding));
  }
  if (layout.golomb_parameter > kMaxGolombParameter) {
    r.fail("golomb parameter " + std::to_string(layout.golomb_parameter) + " above " +
           std::to_string(kMaxGolombParameter));
  }
  layout.bitmap = coding == kBitmapPositions;
  layout.bytes = r.take(position_bytes, "positions");
  if (layout.bitmap && position_bytes != wire::bytes_for_bits(static_cast<uint64_t>(n))) {
    r.fail("the bitmap is not ceil(n/8) bytes");
  }
  if (!layout.bitmap && k == 0 && position_bytes != 0) r.fail("position bytes left over");
  return layout;
}

void read_positions(const wire::Reader& r, const PositionLayout& layout, uint64_t k, int64_t n,
                    std::vector<int64_t>& indices) {
  const uint8_t* positions = r.at(layout.bytes);
  indices.clear();
  indices.reserve(k);
  if (layout.bitmap) {
    for (int64_t i = 0; i < n; ++i) {
      if ((positions[i / 8] >> (i % 8)) & 1) indices.push_back(i);
    }
    if (indices.size() != k) {
      r.fail("the bitmap marks " + std::to_string(indices.size()) + " positions, k is " + std::to_string(k));
    }
    return;
  }
  const int b = layout.golomb_parameter;
  bitpack::BitReader bits(positions, layout.bytes.bytes);
  int64_t at = -1;
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t quotient = bits.get_ones();
    if (quotient > static_cast<uint64_t>(n)) r.fail("a position gap runs past the tensor");
    const uint64_t gap = (quotient << b) | bits.get(b);
    if (bits.failed()) r.fail("the positions end before k = " + std::to_string(k) + " were read");
    if (gap >= static_cast<uint64_t>(n - at - 1)) r.fail("position past the last element");
    at += static_cast<int64_t>(gap) + 1;
    indices.push_back(at);
  }
  if (wire::bytes_for_bits(bits.bits_read()) != layout.bytes.bytes) r.fail("position bytes left over");
}

}  // namespace gradzip
