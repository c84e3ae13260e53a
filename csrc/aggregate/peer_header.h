// The header of a gossip or choco message (aggregate/gossip.h): six int64 fields that
// travel before the message's bytes, and that a receiver checks before it allocates or
// decodes anything. Each side also states the most bytes it accepts, so both ends of a
// pair judge a message's size alike and refuse it together: a message refused only by
// its receiver would leave its sender waiting for bytes that never come. Torch-free, so the header fuzzer (tests/fuzz) builds it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gradzip {

struct PeerHeader {
  int64_t bytes = 0;    // the message's byte count
  bool finite = true;   // choco: false when the sender's input held Inf or NaN (no payload)
  int64_t dtype = 0;    // c10::ScalarType of the tensor
  int64_t numel = 0;    // its element count
  int64_t step = 0;     // the sender's call count for the tensor
  int64_t accepts = 0;  // the most bytes the sender accepts in a peer's message
  std::vector<int64_t> fields() const;
  // What the peers of one call must agree on: dtype, numel and step.
  bool agrees_with(const PeerHeader& other) const;
};

constexpr size_t kPeerHeaderFields = 6;

// A peer's header from its fields; throws std::invalid_argument naming the first thing
// wrong: a field count other than kPeerHeaderFields, a negative byte count, a finite
// flag other than 0 or 1, a non-finite message with bytes, a negative dtype, element
// count, step or accepted size. (How many bytes a header may announce is the receiver's to bound.)
PeerHeader parse_peer_header(const int64_t* fields, size_t count);

}  // namespace gradzip
