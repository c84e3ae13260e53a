// MpiBackend's point-to-point calls: each posted at once, in call order (MPI matches
// messages in posting order), and completed by one thread that polls every pending call
// at the pace of mpi::Backoff, completes its future under a pass of the exit gate, and
// fails it (breaking the communicator) when its timeout passes.
#include "transport/mpi/mpi_backend.h"

#include <stdexcept>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "work/exit_gate.h"
#include "work/future_work.h"
#include "transport/mpi/mpi_argument_checks.h"
#include "transport/mpi/mpi_buffers.h"

namespace gradzip {

struct MpiBackend::PendingPointToPoint {
  MPI_Request request = MPI_REQUEST_NULL;
  at::Tensor target;   // the caller's tensor
  at::Tensor staging;  // contiguous; `target` itself when it is contiguous
  bool receive = false;
  int peer = 0;
  mpi::Clock::time_point deadline;
  std::string what;  // "send to rank 1 (tag 0) on rank 0 of 2"
  std::shared_ptr<std::atomic<int>> source = std::make_shared<std::atomic<int>>(-1);
  c10::intrusive_ptr<c10::ivalue::Future> future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
};

c10::intrusive_ptr<c10d::Work> MpiBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  check_one(tensors, "send");
  check_rank(dst_rank, getSize(), "send", "destination");
  return point_to_point("send", tensors[0], dst_rank, tag, false);
}

c10::intrusive_ptr<c10d::Work> MpiBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  check_one(tensors, "recv");
  check_rank(src_rank, getSize(), "recv", "source");
  return point_to_point("recv", tensors[0], src_rank, tag, true);
}

c10::intrusive_ptr<c10d::Work> MpiBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  check_one(tensors, "recv");
  return point_to_point("recv", tensors[0], MPI_ANY_SOURCE, tag, true);
}

c10::intrusive_ptr<c10d::Work> MpiBackend::point_to_point(const char* op, at::Tensor tensor, int peer, int tag,
                                                          bool receive) {
  check_usable(op);
  const int n = count_of(tensor.numel(), op);
  TORCH_CHECK(tag >= 0 && tag <= largest_tag_, "gradzip mpi: ", op, "'s tag ", tag, " is outside MPI's range 0..",
              largest_tag_, " (MPI_TAG_UB of this MPI library)");
  auto entry = std::make_shared<PendingPointToPoint>();
  entry->target = tensor;
  entry->staging = receive && !tensor.is_contiguous() ? at::empty(tensor.sizes(), tensor.options()) : staged(tensor);
  entry->receive = receive;
  entry->peer = peer;
  entry->deadline = mpi::Clock::now() + timeout_;
  entry->what = c10::str(op, peer == MPI_ANY_SOURCE ? " from any rank" : (receive ? " from rank " : " to rank "),
                         peer == MPI_ANY_SOURCE ? "" : std::to_string(peer), " (tag ", tag, ") on rank ", getRank(),
                         " of ", getSize());
  mpi::call([&] {
    const MPI_Datatype type = type_of(entry->staging);
    mpi::check(receive ? MPI_Irecv(entry->staging.data_ptr(), n, type, peer, tag, comm_, &entry->request)
                       : MPI_Isend(entry->staging.data_ptr(), n, type, peer, tag, comm_, &entry->request),
               receive ? "MPI_Irecv" : "MPI_Isend");
  });
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending_.push_back(entry);
    ++posted_;
    if (!completer_.joinable()) completer_ = std::thread([this] { complete_point_to_point(); });
  }
  pending_wake_.notify_one();
  return c10::make_intrusive<FutureWork>(entry->future, entry->source);
}

int64_t MpiBackend::pending_bytes() const {
  int64_t bytes = 0;
  for (const auto& entry : pending_) bytes += entry->staging.nbytes();
  return bytes;
}

void MpiBackend::complete_point_to_point() {
  std::unique_lock<std::mutex> lock(pending_mutex_);
  mpi::Backoff backoff(0);
  uint64_t seen = 0;  // posted_ when the backoff last restarted
  while (true) {
    pending_wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
    if (posted_ != seen) {  // a new call: poll at full pace again
      seen = posted_;
      backoff.restart(pending_bytes());
    }
    bool more = false;
    {  // a pass while futures complete and finished calls are let go, not while pausing
      const exit_gate::Pass pass = exit_gate::enter();
      if (!pass) return;  // the interpreter is exiting: the calls stay pending, kept with the communicator
      if (stopping_) {
        for (auto& entry : pending_) {
          entry->future->setError(std::make_exception_ptr(
              std::runtime_error("gradzip mpi: " + entry->what + " did not finish before the process group shut down")));
        }
        pending_.clear();
        return;
      }
      const auto entries = pending_;
      lock.unlock();
      std::vector<std::shared_ptr<PendingPointToPoint>> finished;
      for (const auto& entry : entries) {
        try {
          int done = 0;
          MPI_Status status;
          mpi::call([&] { mpi::check(MPI_Test(&entry->request, &done, &status), entry->what.c_str()); });
          if (done) {
            finished.push_back(entry);
            if (entry->receive) {
              int count = 0;
              MPI_Get_count(&status, type_of(entry->staging), &count);
              TORCH_CHECK(count == entry->staging.numel(), "gradzip mpi: ", entry->what, " expected ",
                          entry->staging.numel(), " elements, rank ", status.MPI_SOURCE, " sent ", count);
              entry->source->store(status.MPI_SOURCE);
              unstage(entry->staging, entry->target);
            }
            entry->future->markCompleted(c10::IValue(std::vector<at::Tensor>{entry->target}));
          } else if (mpi::Clock::now() >= entry->deadline) {
            const std::string reason = "gradzip mpi: " + entry->what +
                                       " did not finish within its timeout: the peer has stopped or died, or made "
                                       "no matching call. This communicator refuses every later call.";
            break_with(reason);
            finished.push_back(entry);
            entry->future->setError(std::make_exception_ptr(std::runtime_error(reason)));
          }
        } catch (...) {
          finished.push_back(entry);
          if (!entry->future->completed()) entry->future->setError(std::current_exception());
        }
      }
      lock.lock();
      for (const auto& entry : finished) pending_.remove(entry);
      if (!finished.empty()) backoff.restart(pending_bytes());
      more = !pending_.empty();
    }
    if (!more) continue;
    const auto pause = backoff.pause_at(mpi::Clock::now());
    if (pause == mpi::Clock::duration::zero()) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      pending_wake_.wait_for(lock, pause);  // a new call or shutdown wakes it at once
    }
  }
}

}  // namespace gradzip
