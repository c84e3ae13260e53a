#include "aggregate/slots.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "codec/payload_padding.h"

namespace gradzip {

int64_t slot_bytes(const Codec& codec, int64_t n) {
  return kSlotHeaderBytes + padded_payload_bytes(static_cast<int64_t>(codec.max_payload_bytes(n)));
}

void check_slot_fits(int64_t size, int64_t slot_bytes) {
  TORCH_INTERNAL_ASSERT(size <= slot_bytes - kSlotHeaderBytes, "gradzip: a payload of ", size,
                        " bytes is larger than its codec's bound (", slot_bytes - kSlotHeaderBytes, ")");
}

void seal_slot(size_t size, uint8_t* slot, int64_t slot_bytes) {
  check_slot_fits(static_cast<int64_t>(size), slot_bytes);
  const uint64_t declared = size;
  std::memcpy(slot, &declared, 8);
  std::memset(slot + kSlotHeaderBytes + size, 0, slot_bytes - kSlotHeaderBytes - size);
}

size_t slot_payload_size(uint64_t declared, int64_t slot_bytes, int row) {
  if (declared == kFailedSlot) throw SlotError(row, "that rank could not decode a piece it received (its own error names it)");
  if (declared > static_cast<uint64_t>(slot_bytes - kSlotHeaderBytes)) {
    throw SlotError(row, "its slot declares " + std::to_string(declared) + " bytes, more than the " +
                             std::to_string(slot_bytes - kSlotHeaderBytes) + " a slot holds");
  }
  return static_cast<size_t>(declared);
}

void mark_failed_slot(at::Tensor slot) {
  slot.narrow(0, 0, kSlotHeaderBytes).fill_(0xFF);
  slot.narrow(0, kSlotHeaderBytes, slot.numel() - kSlotHeaderBytes).zero_();
}

}  // namespace gradzip
