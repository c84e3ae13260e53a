// Checked point-to-point: send/recv that say so when the two sides disagree, and that
// complete in whatever order the application waits.
//
// Why checked: Gloo takes a recv larger than the send as complete (the tail keeps its
// old contents), aborts the whole process on a smaller one, and reinterprets the bytes
// when the dtypes differ. So every send is preceded by a small header on the same tag
// (magic, dtype, element count; three int64s), and a receive takes the header first: on
// a match it receives the data into the tensor; on a mismatch it receives the data into
// a scratch buffer of the announced size (the stream between the two ranks stays in
// step) and fails, naming both sides.
//
// Why a thread: Gloo completes a send only once the peer has posted the matching
// receive, and the data's receive can be posted only once its header is in. If that
// waited for the application to wait on the receive, a rank that waits on its sends
// first (a ring, pipeline schedules, mlbench's neighbour exchange) would never get
// there. So receives are driven by a small pool of threads: each (source, tag) line of
// receives runs on one of them, in the order the receives were made (messages from one
// rank with one tag arrive in order), and a receive's work completes when its data is
// in, whether or not anybody waits. The pool grows to the number of lines with a
// receive outstanding at once, and its idle threads stay for the next receive.
//
// Receives from any source on a tag form their own line. Receives on one tag are
// matched in the order they were made across the two kinds: a receive from any source
// starts once the tag's receives from named sources made before it have completed, and
// the other way round, so that a header is never taken by the wrong kind of receive.
//
// Limits: a peer may announce at most 4 x the receive's bytes + 1 MiB (the scratch a
// mismatch drains into is bounded by that); a larger announcement, a corrupt header or a
// message without a header fails the receive and every later receive from that rank on
// that tag (the stream is out of step; the sender's send fails at its timeout). Each
// message must arrive within the transport's timeout of its receive starting (as the
// MPI transport's own receives do). Both ranks must check (the group's validate
// setting); CPU tensors only: the caller forwards CUDA tensors unchecked.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

c10::intrusive_ptr<c10d::Work> checked_send(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int dst_rank, int tag);

// A peer's announcement of `announced` bytes is drained (not refused) when the receive
// expected `expected` bytes and announced <= 4 * expected + 1 MiB.
bool drainable_announcement(int64_t announced, int64_t expected);

// The checked receives of one process group. Made with create(); stop() ends it.
class CheckedReceives : public std::enable_shared_from_this<CheckedReceives> {
 public:
  static std::shared_ptr<CheckedReceives> create();
  // src_rank < 0: from any rank (recvAnysource). The work completes once the data is in.
  c10::intrusive_ptr<c10d::Work> recv(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                      int src_rank, int tag);
  // Fails every receive not yet complete (`reason`) and lets the threads go: they end
  // once their transport calls return (aborted where the transport can abort them).
  void stop(const std::string& reason);

 private:
  struct Receive;
  struct Line {  // the receives from one source (or any) with one tag, in order
    std::deque<std::shared_ptr<Receive>> queue;
    bool scheduled = false;                    // a thread runs it or will
    c10::intrusive_ptr<c10d::Work> in_flight;  // the transport receive being waited for
  };
  struct Gate {  // one tag's receives: those of one kind (named or any source) run at a time
    int running = 0;
    bool any_source = false;
    std::deque<std::shared_ptr<Receive>> waiting;
  };
  using LineKey = std::pair<int, int>;  // (source or -1, tag)

  CheckedReceives() = default;
  void admit(const std::shared_ptr<Receive>& receive);     // under mutex_
  void schedule(const std::shared_ptr<Receive>& receive);  // under mutex_
  void settle(const Receive& receive);                     // under mutex_
  std::exception_ptr broken(int src, int tag) const;       // under mutex_
  void serve();
  void run_line(std::unique_lock<std::mutex>& lock, const LineKey& key);
  // Receives the header, then the data: no lock held. Returns the receive's error, if any.
  std::exception_ptr receive_one(Receive& receive, Line& line);
  c10::intrusive_ptr<c10d::Work> post(Line& line, c10::intrusive_ptr<c10d::Work> work);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<LineKey, Line> lines_;
  std::map<int, Gate> gates_;
  std::map<int, std::map<int, std::exception_ptr>> broken_;  // tag -> source -> why its stream is out of step
  std::deque<LineKey> ready_;                                // lines waiting for a thread
  int idle_ = 0;  // threads waiting for a line, less the lines in ready_ promised to them
  bool stopping_ = false;
  std::string stop_reason_;
};

}  // namespace gradzip
