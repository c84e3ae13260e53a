// libFuzzer target: the gossip/choco message header (aggregate/peer_header.h) on arbitrary
// int64 fields. Malformed headers may be refused only with std::invalid_argument; a
// header that parses must give back exactly the fields it came from.
#include <cstring>
#include <stdexcept>
#include <vector>

#include "aggregate/peer_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<int64_t> fields(size / 8);
  if (!fields.empty()) std::memcpy(fields.data(), data, fields.size() * 8);
  try {
    const gradzip::PeerHeader header = gradzip::parse_peer_header(fields.data(), fields.size());
    if (header.fields() != fields) __builtin_trap();
    if (!header.agrees_with(header)) __builtin_trap();
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
