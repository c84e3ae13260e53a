// Little-endian byte writing and bounds-checked reading for payloads.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradzip/codec.h"

namespace gradzip::wire {

// Appends to a byte vector, or writes into a buffer of fixed capacity (an exchange's
// slot): the same codec code for both.
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : vector_(&out) {}
  // Writes into data[0..capacity); writing past it is a logic error (the codec's
  // max_payload_bytes was wrong).
  Writer(uint8_t* data, size_t capacity) : data_(data), capacity_(capacity) {}

  // The bytes written (appended) so far.
  size_t size() const { return vector_ ? vector_->size() : size_; }

  template <typename T>
  void put(T value) {
    std::memcpy(grow(sizeof(T)), &value, sizeof(T));  // x86-64 and CUDA hosts are little-endian
  }
  // Reserves `bytes` zeroed bytes and returns where they start (valid until the next put).
  uint8_t* reserve(size_t bytes) {
    uint8_t* at = grow(bytes);
    if (!vector_) std::memset(at, 0, bytes);  // a vector's resize has zeroed them
    return at;
  }
  // Reserves `bytes` that the caller writes every one of (in a fixed buffer they are not
  // zeroed first).
  uint8_t* reserve_uninitialized(size_t bytes) { return grow(bytes); }
  // n floats, as they are (a raw section).
  void put_floats(const float* values, int64_t n) {
    if (n > 0) std::memcpy(reserve_uninitialized(static_cast<size_t>(n) * 4), values, static_cast<size_t>(n) * 4);
  }
  // Bytes, as they are.
  void put_bytes(const std::vector<uint8_t>& bytes) {
    if (!bytes.empty()) std::memcpy(reserve_uninitialized(bytes.size()), bytes.data(), bytes.size());
  }
  void header(CodecId codec, uint64_t numel, uint32_t flags = 0) {
    put<uint16_t>(0x5A47);  // "GZ"
    put<uint8_t>(kWireVersion);
    put<uint8_t>(static_cast<uint8_t>(codec));
    put<uint32_t>(flags);
    put<uint64_t>(numel);
  }

 private:
  uint8_t* grow(size_t bytes) {
    if (vector_) {
      const size_t at = vector_->size();
      vector_->resize(at + bytes);
      return vector_->data() + at;
    }
    if (bytes > capacity_ - size_) throw std::logic_error("gradzip: a payload outgrew its codec's max_payload_bytes");
    uint8_t* at = data_ + size_;
    size_ += bytes;
    return at;
  }

  std::vector<uint8_t>* vector_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0, size_ = 0;
};

// Where a section lies in a payload.
struct Section {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Reads a payload's fixed fields and checks its section lengths. A codec's layout
// parser runs on a Reader; the CPU decoder gives it the whole payload, the CUDA dispatch
// the payload's first bytes copied to the host (`have` of its `size` bytes): the same
// parser, the same checks and messages, for both.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const char* codec) : Reader(data, size, size, codec) {}
  Reader(const uint8_t* data, size_t have, size_t size, const char* codec)
      : data_(data), have_(have < size ? have : size), size_(size), codec_(codec) {}

  template <typename T>
  T get(const char* field) {
    need(sizeof(T), field);
    if (at_ + sizeof(T) > have_) throw std::logic_error("gradzip: a fixed payload field lies beyond the bytes read");
    T value;
    std::memcpy(&value, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  // The next `bytes` bytes; throws when fewer are left.
  Section take(uint64_t bytes, const char* field) {
    need(bytes, field);
    const Section section{at_, bytes};
    at_ += bytes;
    return section;
  }
  // A section's bytes, when this Reader holds them.
  const uint8_t* at(const Section& section) const {
    if (section.offset + section.bytes > have_) throw std::logic_error("gradzip: a payload section lies beyond the bytes read");
    return data_ + section.offset;
  }
  // A count of selected entries: throws unless it is at most n.
  uint64_t get_count(const char* field, int64_t n) {
    const uint64_t k = get<uint64_t>(field);
    if (k > static_cast<uint64_t>(n)) {
      fail(std::string(field) + " = " + std::to_string(k) + " exceeds the " + std::to_string(n) + " elements");
    }
    return k;
  }
  // Skips the header after checking it names this codec and n elements.
  void header(CodecId codec, int64_t n);
  // Throws unless every byte was read.
  void finish() const;
  [[noreturn]] void fail(const std::string& why) const;

 private:
  void need(uint64_t bytes, const char* field) const {
    if (bytes > size_ - at_) {
      fail(std::string("truncated: ") + field + " needs " + std::to_string(bytes) + " bytes at offset " +
           std::to_string(at_) + ", only " + std::to_string(size_ - at_) + " left");
    }
  }

  const uint8_t* data_;
  size_t have_, size_;
  size_t at_ = 0;
  const char* codec_;
};

// out[i] += scale × the i-th of n floats of a raw section.
inline void add_floats(const uint8_t* values, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, values + 4 * i, 4);
    out[i] += scale * v;
  }
}

// Bytes needed for `bits` bits.
inline uint64_t bytes_for_bits(uint64_t bits) { return (bits + 7) / 8; }

}  // namespace gradzip::wire
