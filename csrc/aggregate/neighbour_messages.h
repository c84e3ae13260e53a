// Point-to-point exchange with a rank's gossip neighbours over the transport.
//
// Each call sends this rank's message to every peer and receives every peer's message:
// first a small header of int64s (header[0] is the message's byte count, the rest is
// the caller's fingerprint), then the bytes, sized by the header received. Pairs post in
// a globally consistent order (the lower rank sends first), so blocking transports (NCCL
// on one stream per pair) cannot deadlock. Messages carry kGossipTag, so they never match
// a user's send/recv on the same transport.
#pragma once

#include <functional>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

constexpr int kGossipTag = 0x67a05;

struct PeerMessage {
  int rank;
  std::vector<int64_t> header;  // as sent by the peer; header[0] = bytes.numel()
  at::Tensor bytes;             // uint8, on the transport's device
};

// `bytes` is a contiguous uint8 tensor on the transport's device; header[0] must equal
// bytes.numel() and every peer must send a header of the same length. `check` sees each
// peer's header before anything is allocated for its message, and throws to refuse it:
// a refused peer exchanges no bytes with this rank (the check must refuse symmetrically),
// the others do, then the first refusal is rethrown. Returns the peers' messages in the
// order of `peers`.
using PeerHeaderCheck = std::function<void(int rank, const std::vector<int64_t>& header)>;
std::vector<PeerMessage> exchange_neighbour_messages(const std::vector<int64_t>& header, const at::Tensor& bytes,
                                             const std::vector<int>& peers,
                                             const c10::intrusive_ptr<c10d::Backend>& transport,
                                             const PeerHeaderCheck& check);

}  // namespace gradzip
