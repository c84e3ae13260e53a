// ScratchCarver: cuts one device scratch allocation into 256-byte-aligned pieces.
//
// With a null base it only measures: every take() returns nullptr and size() is then
// the allocation to make; given that allocation, the same sequence of take() calls
// returns the pieces. Host code only.
#pragma once

#include <cstddef>

namespace gradzip::cuda {

class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}

  // Room for `count` objects of type T.
  template <class T>
  T* take(size_t count) {
    return static_cast<T*>(take_bytes(sizeof(T) * count));
  }

  void* take_bytes(size_t bytes) {
    char* piece = base_ ? base_ + offset_ : nullptr;
    offset_ += (bytes + 255) / 256 * 256;
    return piece;
  }

  size_t size() const { return offset_; }

 private:
  char* base_;
  size_t offset_ = 0;
};

}  // namespace gradzip::cuda
