// Checked point-to-point: send/recv that say so when the two sides disagree.
//
// Why: Gloo takes a recv larger than the send as complete (the tail keeps its old
// contents), aborts the whole process on a smaller one, and reinterprets the bytes when
// the dtypes differ. So every send is preceded by a small header on the same tag (the
// dtype and element count; int64s, sent without waiting), and a recv takes the header
// first: on a match it receives into the tensor; on a mismatch it receives the data into
// a scratch buffer of the announced size (the stream between the two ranks stays in
// step) and its wait() raises, naming both sides. The header costs one small message per
// send, not a round trip. Both ranks must check (the group's validate setting), and CPU
// tensors only: the caller forwards CUDA tensors unchecked.
#pragma once

#include <map>
#include <mutex>
#include <utility>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

c10::intrusive_ptr<c10d::Work> checked_send(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int dst_rank, int tag);

class CheckedRecvWork;

// The checked receives of one process group. A receive posts its header's receive only
// once the receive before it from the same rank with the same tag has posted its data's
// (when that one's header arrives, or when it is waited for), so two receives outstanding
// at once each get their own header and data, in the order they were made. Receives from
// any rank form one such line per tag.
class CheckedReceives {
 public:
  CheckedReceives();
  ~CheckedReceives();
  // src_rank < 0: from any rank (recvAnysource).
  c10::intrusive_ptr<c10d::Work> recv(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                      int src_rank, int tag);

 private:
  std::mutex mutex_;
  std::map<std::pair<int, int>, c10::weak_intrusive_ptr<CheckedRecvWork>> last_;  // (rank, tag): the latest
};

}  // namespace gradzip
