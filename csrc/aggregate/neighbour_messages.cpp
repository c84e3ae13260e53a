#include "aggregate/neighbour_messages.h"

#include <c10/util/Exception.h>

namespace gradzip {
namespace {

// Posts a send of `out` and a receive into `in` for each peer (the lower rank of a pair
// sends first), then waits for all of them.
void post_and_wait(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in, const std::vector<int>& peers,
                   const c10::intrusive_ptr<c10d::Backend>& transport) {
  const int rank = transport->getRank();
  std::vector<c10::intrusive_ptr<c10d::Work>> pending;
  for (size_t p = 0; p < peers.size(); ++p) {
    std::vector<at::Tensor> send = {out[p]};
    std::vector<at::Tensor> recv = {in[p]};
    if (send.front().numel() == 0 && recv.front().numel() == 0) continue;
    TORCH_CHECK(peers[p] != rank, "gradzip: a rank cannot gossip with itself");
    if (rank < peers[p]) {
      if (send.front().numel() > 0) pending.push_back(transport->send(send, peers[p], kGossipTag));
      if (recv.front().numel() > 0) pending.push_back(transport->recv(recv, peers[p], kGossipTag));
    } else {
      if (recv.front().numel() > 0) pending.push_back(transport->recv(recv, peers[p], kGossipTag));
      if (send.front().numel() > 0) pending.push_back(transport->send(send, peers[p], kGossipTag));
    }
  }
  for (auto& work : pending) work->wait();
}

}  // namespace

std::vector<PeerMessage> exchange_neighbour_messages(const std::vector<int64_t>& header, const at::Tensor& bytes,
                                             const std::vector<int>& peers,
                                             const c10::intrusive_ptr<c10d::Backend>& transport,
                                             const PeerHeaderCheck& check) {
  TORCH_CHECK(!header.empty() && header[0] == bytes.numel(), "gradzip: header[0] must be the message's byte count");
  const auto device = bytes.device();
  const auto mine = at::tensor(header, at::kLong).to(device);
  std::vector<at::Tensor> out_headers(peers.size(), mine);
  std::vector<at::Tensor> in_headers;
  for (size_t p = 0; p < peers.size(); ++p) in_headers.push_back(at::empty_like(mine));
  post_and_wait(out_headers, in_headers, peers, transport);

  // A refused peer exchanges no bytes with this rank (it refuses this rank's header too:
  // the checks compare both ways); the others still do, then the first refusal raises.
  std::vector<PeerMessage> messages;
  std::vector<at::Tensor> in_bytes, out_bytes;
  std::exception_ptr refused;
  const auto nothing = at::empty({0}, at::dtype(at::kByte).device(device));
  for (size_t p = 0; p < peers.size(); ++p) {
    const auto h = in_headers[p].cpu();
    PeerMessage m{peers[p], std::vector<int64_t>(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel()), nothing};
    try {
      check(peers[p], m.header);
      m.bytes = at::empty({m.header[0]}, at::dtype(at::kByte).device(device));
      out_bytes.push_back(bytes);
    } catch (...) {
      if (!refused) refused = std::current_exception();
      out_bytes.push_back(nothing);
    }
    in_bytes.push_back(m.bytes);
    messages.push_back(std::move(m));
  }
  post_and_wait(out_bytes, in_bytes, peers, transport);
  if (refused) std::rethrow_exception(refused);
  return messages;
}

}  // namespace gradzip
