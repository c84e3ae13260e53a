#include "aggregate/peer_header.h"

#include <stdexcept>

namespace gradzip {

std::vector<int64_t> PeerHeader::fields() const { return {bytes, finite ? 1 : 0, dtype, numel, step, accepts}; }

bool PeerHeader::agrees_with(const PeerHeader& other) const {
  return dtype == other.dtype && numel == other.numel && step == other.step;
}

PeerHeader parse_peer_header(const int64_t* fields, size_t count) {
  const auto fail = [](const std::string& why) { throw std::invalid_argument("a malformed gossip header: " + why); };
  if (count != kPeerHeaderFields) {
    fail(std::to_string(count) + " fields, not " + std::to_string(kPeerHeaderFields));
  }
  PeerHeader h;
  h.bytes = fields[0];
  if (h.bytes < 0) fail("a message of " + std::to_string(h.bytes) + " bytes");
  if (fields[1] != 0 && fields[1] != 1) fail("finite flag " + std::to_string(fields[1]));
  h.finite = fields[1] == 1;
  if (!h.finite && h.bytes != 0) fail("a non-finite message with " + std::to_string(h.bytes) + " bytes");
  h.dtype = fields[2];
  h.numel = fields[3];
  h.step = fields[4];
  h.accepts = fields[5];
  if (h.dtype < 0 || h.numel < 0 || h.step < 0 || h.accepts < 0) {
    fail("a negative dtype, element count, step or accepted size");
  }
  return h;
}

}  // namespace gradzip
