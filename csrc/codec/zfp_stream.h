// One ZFP stream (Debian's libzfp) over a 1-D float field, its resources released with it:
// fixed-accuracy mode at a tolerance, or ZFP's reversible (lossless) mode.
#pragma once

#include <zfp.h>

#include <cstddef>
#include <cstdint>
#include <new>

namespace gradzip {

constexpr uint8_t kZfpAccuracy = 0, kZfpReversible = 1;

class ZfpStream {
 public:
  ZfpStream(float* values, int64_t n, uint8_t mode, double tolerance)
      : field_(zfp_field_1d(values, zfp_type_float, static_cast<size_t>(n))), stream_(zfp_stream_open(nullptr)) {
    if (!field_ || !stream_) throw std::bad_alloc();
    if (mode == kZfpReversible) {
      zfp_stream_set_reversible(stream_);
    } else {
      zfp_stream_set_accuracy(stream_, tolerance);
    }
  }
  ~ZfpStream() {
    if (bits_) stream_close(bits_);
    zfp_stream_close(stream_);
    zfp_field_free(field_);
  }
  ZfpStream(const ZfpStream&) = delete;
  ZfpStream& operator=(const ZfpStream&) = delete;

  size_t maximum_bytes() const { return zfp_stream_maximum_size(stream_, field_); }
  // Compresses the field into buffer[0..capacity) and returns the bytes written.
  size_t compress(uint8_t* buffer, size_t capacity) {
    attach(buffer, capacity);
    return zfp_compress(stream_, field_);
  }
  // Decompresses buffer[0..capacity) into the field; returns the bytes read (0: failed).
  size_t decompress(uint8_t* buffer, size_t capacity) {
    attach(buffer, capacity);
    return zfp_decompress(stream_, field_);
  }

 private:
  void attach(uint8_t* buffer, size_t capacity) {
    if (bits_) stream_close(bits_);
    bits_ = stream_open(buffer, capacity);
    if (!bits_) throw std::bad_alloc();
    zfp_stream_set_bit_stream(stream_, bits_);
    zfp_stream_rewind(stream_);
  }

  zfp_field* field_;
  zfp_stream* stream_;
  bitstream* bits_ = nullptr;
};

}  // namespace gradzip
