// Checked point-to-point: send/recv that say so when the two sides disagree, and that
// complete in whatever order the application waits.
//
// Why checked: Gloo takes a recv larger than the send as complete (the tail keeps its
// old contents), aborts the whole process on a smaller one, and reinterprets the bytes
// when the dtypes differ. So a message is two: a header on the message's tag (magic,
// dtype, element count; three int64s) and the data on tag + data_tag_offset(). A receive
// takes a header first: on a match it receives the data into the tensor; on a mismatch
// it drains the data into a scratch buffer of the announced size (the stream between
// the two ranks stays in step) and fails, naming both sides. Headers and data never
// share a tag, so a header receive can only ever meet a header.
//
// Why threads: Gloo completes a send only once the peer has posted the matching
// receive, and the data's receive can be posted only once its header is in. If that
// waited for the application to wait on the receive, a rank that waits on its sends
// first (a ring, pipeline schedules, mlbench's neighbour exchange) would never get
// there. So the transport's works are waited for by a small pool of threads, one lane
// of works each: the header receives from one source (or any) on one tag, and the data
// receives from one source on one tag, each lane in posting order. A receive completes
// when its data is in, whether or not anybody waits. A thread completes a receive and
// lets go of a finished work under a pass of the exit gate (work/exit_gate.h).
//
// Matching: headers that arrive are given, in arrival order, to the earliest receive
// made on that tag that accepts their source (named, or any), as MPI matches messages;
// a header nobody has asked for yet is held until a receive takes it (its data waits on
// the sender's side, as Gloo's sends do). On Gloo, a lane keeps its next header receive
// posted after each message (a repeated exchange then finds its header already in: one
// round trip per message, as Gloo's own); on other transports a header receive is posted
// only for a receive that wants one, since their receives time out by themselves.
//
// Limits: tags 0 .. data_tag_offset() - 1. A peer may announce at most 4 x the receive's
// bytes + 1 MiB (the scratch a mismatch drains into is bounded by that); a larger
// announcement, a corrupt header or a message without a header fails the receive and
// every later receive from that rank on that tag (the stream is out of step; the
// sender's send fails at its timeout). wait() with no timeout of its own waits the
// group's timeout, then raises (the receive goes on in the background). Both ranks
// must check (the group's validate setting); CPU tensors only: the caller forwards CUDA
// tensors unchecked.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

// Where a message's data travels: on its tag + this offset, half of the transport's tag
// space (Gloo and Open MPI: 2^30; MPICH: 2^27). User tags run 0 .. offset - 1.
int data_tag_offset(const c10d::Backend& transport);

c10::intrusive_ptr<c10d::Work> checked_send(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int dst_rank, int tag);

// A peer's announcement of `announced` bytes is drained (not refused) when the receive
// expected `expected` bytes and announced <= 4 * expected + 1 MiB.
bool drainable_announcement(int64_t announced, int64_t expected);

// The checked receives of one process group. Made with create(); stop() ends it.
class CheckedReceives : public std::enable_shared_from_this<CheckedReceives> {
 public:
  static std::shared_ptr<CheckedReceives> create(std::chrono::milliseconds timeout);
  void set_timeout(std::chrono::milliseconds timeout);
  // src_rank < 0: from any rank (recvAnysource). The work completes once the data is in.
  c10::intrusive_ptr<c10d::Work> recv(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                      int src_rank, int tag);
  // Fails every receive not yet complete (`reason`) and lets the threads go: they end
  // once their transport works return (aborted where the transport can abort them).
  void stop(const std::string& reason);
  // After stop(): waits until every thread has ended, having let go of every tensor and
  // work it held, at most `within` (a thread still waiting for a work that its transport
  // could not abort ends when that transport shuts down). False when some did not end.
  // The backend's shutdown() and abort() call it once their transports are shut down,
  // so that no thread lets go of an application's tensor later, when the interpreter
  // may be exiting (a thread that then takes the GIL to free it is ended by Python
  // mid-destructor, which aborts the process).
  bool join(std::chrono::milliseconds within);

 private:
  struct Receive;
  struct Header;
  // A transport work to wait for, then what to do with it (no lock held; the error if it
  // failed or was aborted).
  struct Step {
    c10::intrusive_ptr<c10d::Work> work;
    std::function<void(c10d::Work&, std::exception_ptr)> then;
  };
  struct Lane {  // works waited for in order by one thread at a time
    std::deque<Step> steps;
    bool scheduled = false;  // a thread runs it or will
  };
  enum class LaneKind { kHeaders, kData };
  using LaneKey = std::tuple<LaneKind, int, int>;  // (kind, source or -1, tag)
  struct TagState {
    std::deque<std::shared_ptr<Receive>> pending;  // without a header yet, in the order made
    std::deque<std::shared_ptr<Header>> held;      // arrived with no receive to take them
    std::map<int, bool> posting;                   // source (-1: any) -> a header receive is posted
  };

  explicit CheckedReceives(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  // All under mutex_:
  using Done = std::vector<std::function<void()>>;  // futures to complete once the lock is let go
  void want_header(const c10::intrusive_ptr<c10d::Backend>& transport, int src, int tag);
  void header_in(const c10::intrusive_ptr<c10d::Backend>& transport, int src, int tag, c10d::Work& work,
                 const std::shared_ptr<Header>& header, std::exception_ptr error, Done& done);
  void take(const Header& header, const std::shared_ptr<Receive>& receive, Done& done);
  // Marks the stream from `source` on `tag` out of step: its held headers dropped, its
  // pending receives and every later one failed with `why`.
  void break_stream(int tag, int source, std::exception_ptr why, Done& done);
  void fail_pending(int tag, int src, std::exception_ptr error, Done& done);  // those from src (-1: any)
  void enqueue(const LaneKey& key, Step step);
  std::exception_ptr broken(int src, int tag) const;
  // The threads' side:
  // Both false when the exit gate refused a pass (work/exit_gate.h): the interpreter is
  // exiting, the lane's steps are kept, and the thread ends.
  bool serve();
  bool run_lane(std::unique_lock<std::mutex>& lock, const LaneKey& key);
  static void finish(const std::shared_ptr<Receive>& receive, std::exception_ptr error);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::chrono::milliseconds timeout_;
  std::map<LaneKey, Lane> lanes_;
  std::map<int, TagState> tags_;
  std::map<int, std::map<int, std::exception_ptr>> broken_;  // tag -> source -> why its stream is out of step
  std::deque<LaneKey> ready_;                                // lanes waiting for a thread
  int idle_ = 0;  // threads waiting for a lane, less the lanes in ready_ promised to them
  int threads_ = 0;  // threads started and not yet ended
  std::condition_variable ended_;  // notified when a thread ends
  bool stopping_ = false;
  std::string stop_reason_;
};

}  // namespace gradzip
