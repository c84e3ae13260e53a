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
  const auto k = static_cast<int64_t>(chosen.size());
  const int b = golomb_parameter(k, n);
  CodedPositions coded;
  std::vector<uint8_t>& golomb = coded.bytes;
  // The codes take at most ⌊(n − k)/2^b⌋ + k(1 + b) bits (max_position_bytes); 8 bytes of
  // slack let every store be a whole word.
  golomb.resize(wire::bytes_for_bits((static_cast<uint64_t>(n - k) >> b) + static_cast<uint64_t>(k) * (1 + b)) + 8);
  uint8_t* out = golomb.data();
  uint64_t byte = 0;     // whole bytes written
  uint64_t pending = 0;  // the bits after them, `filled` (< 8) of them
  int filled = 0;
  const auto put = [&](uint64_t value, int bits) {  // bits <= 56
    pending |= value << filled;
    filled += bits;
    std::memcpy(out + byte, &pending, 8);
    byte += static_cast<uint64_t>(filled / 8);
    pending = filled >= 8 ? pending >> (filled & ~7) : pending;
    filled &= 7;
  };
  const uint64_t low_mask = (uint64_t{1} << b) - 1;
  int64_t previous = -1;
  for (int64_t i : chosen) {
    const uint64_t gap = static_cast<uint64_t>(i - previous - 1);
    uint64_t ones = gap >> b;
    if (ones + 1 + static_cast<uint64_t>(b) > 56) {  // a long run first, 56 ones at a time
      for (; ones >= 56; ones -= 56) put((uint64_t{1} << 56) - 1, 56);
      put((uint64_t{1} << ones) - 1, static_cast<int>(ones));
      put((gap & low_mask) << 1, 1 + b);
    } else {  // the whole code in one: `ones` one-bits, a zero-bit, the low b bits
      put(((uint64_t{1} << ones) - 1) | ((gap & low_mask) << (ones + 1)), static_cast<int>(ones) + 1 + b);
    }
    previous = i;
  }
  if (filled > 0) out[byte++] = static_cast<uint8_t>(pending);
  golomb.resize(byte);
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

void read_positions(const wire::Reader& r, const PositionLayout& layout, uint64_t k, int64_t n, int64_t* found) {
  const uint8_t* positions = r.at(layout.bytes);
  const uint64_t size = layout.bytes.bytes;
  if (layout.bitmap) {  // a word of the bitmap at a time, its set bits lowest first
    uint64_t marked = 0;
    for (uint64_t word_at = 0; word_at < size; word_at += 8) {
      uint64_t word = 0;
      std::memcpy(&word, positions + word_at, std::min<uint64_t>(8, size - word_at));
      for (; word != 0; word &= word - 1) {
        const auto at = static_cast<int64_t>(word_at * 8) + __builtin_ctzll(word);
        if (at >= n) break;  // the last byte's bits past the tensor are padding
        if (marked < k) found[marked] = at;
        ++marked;
      }
    }
    if (marked != k) r.fail("the bitmap marks " + std::to_string(marked) + " positions, k is " + std::to_string(k));
    return;
  }
  const int b = layout.golomb_parameter;
  const uint64_t low_mask = (uint64_t{1} << b) - 1;
  uint64_t j = 0;
  int64_t at = -1;
  const auto next = [&](uint64_t quotient, uint64_t gap) {
    if (quotient > static_cast<uint64_t>(n)) r.fail("a position gap runs past the tensor");
    if (gap >= static_cast<uint64_t>(n - at - 1)) r.fail("position past the last element");
    at += static_cast<int64_t>(gap) + 1;
    found[j] = at;
  };
  // While 8 bytes remain, one word holds a whole code (its ones, its zero, its low b
  // bits) unless the run is long: the word from the code's byte on, shifted to its bit.
  uint64_t bit = 0;
  for (; j < k && bit / 8 + 8 <= size; ++j) {
    uint64_t word;
    std::memcpy(&word, positions + bit / 8, 8);
    const int valid = 64 - static_cast<int>(bit % 8);
    word >>= bit % 8;
    const int ones = word == ~uint64_t{0} ? 64 : __builtin_ctzll(~word);
    if (ones + 1 + b >= valid) break;  // a long run, or a code that ends at or past this word's end
    next(static_cast<uint64_t>(ones), (static_cast<uint64_t>(ones) << b) | ((word >> (ones + 1)) & low_mask));
    bit += static_cast<uint64_t>(ones + 1 + b);
  }
  // The rest, near the end of the stream or past a long run, through the bit reader.
  bitpack::BitReader bits(positions + bit / 8, size - bit / 8);
  bits.get(static_cast<int>(bit % 8));
  for (; j < k; ++j) {
    const uint64_t quotient = bits.get_ones();
    if (quotient > static_cast<uint64_t>(n)) r.fail("a position gap runs past the tensor");
    const uint64_t gap = (quotient << b) | bits.get(b);
    if (bits.failed()) r.fail("the positions end before k = " + std::to_string(k) + " were read");
    next(quotient, gap);
  }
  if (wire::bytes_for_bits(bit / 8 * 8 + bits.bits_read()) != size) r.fail("position bytes left over");
}

}  // namespace gradzip
