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

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

c10::intrusive_ptr<c10d::Work> checked_send(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int dst_rank, int tag);
// src_rank < 0: from any rank (recvAnysource).
c10::intrusive_ptr<c10d::Work> checked_recv(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int src_rank, int tag);

}  // namespace gradzip
