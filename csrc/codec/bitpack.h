// Bit packing for payloads: sign bits (vectorized with AVX2 when the CPU has it,
// chosen at run time), fixed-width codes, and a bit stream for Golomb-Rice codes.
// Bits are little-endian: element i's bit is bit (i % 8) of byte i / 8.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace gradzip::bitpack {

// out[i/8] bit i%8 = 1 when x[i] >= +0 (sign bit clear). out holds ceil(n/8) bytes.
void pack_nonnegative(const float* x, int64_t n, uint8_t* out);

// out[i] += bit i ? plus : minus, for i in [0, n).
void add_signs(const uint8_t* bits, int64_t n, float plus, float minus, float* out);

// Reads n codes of `width` bits (1..16) each, element i at bit offset i × width.
void unpack_codes(const uint8_t* in, int64_t n, int width, uint16_t* codes);
// Writes codes[0, n) (n a multiple of 8; the low `width` bits, 1..16, of each) into
// exactly n × width / 8 bytes of `out`, element i at bit offset i × width.
void pack_code_groups(const uint32_t* codes, int64_t n, int width, uint8_t* out);

// Writes bits into a growing byte vector; flush() pads the last byte with zeros.
class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>& out) : out_(out) {}
  void put(uint64_t value, int bits);  // the low `bits` bits of value, bits <= 57
  void put_ones(uint64_t count);       // `count` one-bits, then nothing
  void flush();

 private:
  std::vector<uint8_t>& out_;
  uint64_t buffer_ = 0;
  int filled_ = 0;
};

// Reads bits from `size` bytes; reading past the end sets failed() and returns zeros.
// While 8 bytes remain, get() and get_ones() read one word, inline: a Golomb-Rice
// decoder's position costs a few instructions.
class BitReader {
 public:
  BitReader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint64_t get(int bits) {  // bits <= 64
    if (bits > 0 && bits <= 56 && word_at_hand()) {
      const uint64_t value = word() & ((uint64_t{1} << bits) - 1);
      position_ += static_cast<uint64_t>(bits);
      return value;
    }
    return get_near_end(bits);
  }
  bool get_bit();
  // Reads one-bits up to and including the next zero-bit and returns how many ones it
  // read (a Golomb-Rice quotient); at the end of the data, sets failed() and returns
  // the ones read so far.
  uint64_t get_ones() {
    if (word_at_hand()) {
      // The word's top position_ % 8 bits are shifted-in zeros: a run of ones ends within it.
      const uint64_t bits = word();
      if (bits != ~uint64_t{0}) {
        const int run = __builtin_ctzll(~bits);
        if (run < 64 - static_cast<int>(position_ % 8)) {
          position_ += static_cast<uint64_t>(run) + 1;
          return static_cast<uint64_t>(run);
        }
      }
    }
    return get_ones_near_end();
  }
  bool failed() const { return failed_; }
  uint64_t bits_read() const { return position_; }

 private:
  bool word_at_hand() const { return position_ / 8 + 8 <= size_; }
  // The 64 bits from byte position_ / 8 on, shifted to start at position_ (word_at_hand()).
  uint64_t word() const {
    uint64_t w;
    std::memcpy(&w, data_ + position_ / 8, 8);
    return w >> (position_ % 8);
  }
  // get() and get_ones() where fewer than 8 bytes remain (or bits > 56).
  uint64_t get_near_end(int bits);
  uint64_t get_ones_near_end();
  // The bits from position_ on, bit 0 first, and how many of them are data (>= 57
  // unless the data ends sooner); the rest are zeros.
  uint64_t window(int& valid) const;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t position_ = 0;
  bool failed_ = false;
};

}  // namespace gradzip::bitpack
