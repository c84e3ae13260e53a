// Slots: how an exchange frames the payloads it moves. A slot is a u64 payload size, the
// payload, zero padding to a multiple of 8 bytes; its size follows from the codec and the
// element count alone (the codec's bound), so ranks exchange no sizes. A failed slot is
// what an owner sends when it could not decode a piece.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "gradzip/codec.h"

namespace gradzip {

// A payload that could not be decoded: the row (rank) it came from, and why.
class SlotError : public std::runtime_error {
 public:
  SlotError(int row, const std::string& what) : std::runtime_error(what), row_(row) {}
  int row() const { return row_; }

 private:
  int row_;
};

// Slots: a u64 payload size, the payload, zero padding. A failed slot (size
// kFailedSlot) is what an owner sends when it could not decode a piece.
constexpr int64_t kSlotHeaderBytes = 8;
constexpr uint64_t kFailedSlot = ~uint64_t{0};
// The bytes of a slot that holds any payload of `codec` for n elements.
int64_t slot_bytes(const Codec& codec, int64_t n);
// Asserts that a payload of `size` bytes fits a slot of `slot_bytes` (the codec's bound).
void check_slot_fits(int64_t size, int64_t slot_bytes);
// Closes a slot in host memory whose payload of `size` bytes was written in place at
// slot + kSlotHeaderBytes: declares the size and zeroes the padding after it.
void seal_slot(size_t size, uint8_t* slot, int64_t slot_bytes);
// The payload size a slot of `slot_bytes` declares, checked; throws SlotError(row).
size_t slot_payload_size(uint64_t declared, int64_t slot_bytes, int row);
// Marks a slot (uint8 tensor, any device) failed.
void mark_failed_slot(at::Tensor slot);

}  // namespace gradzip
