// OrderedWorker: one thread that runs a process group's aggregations in the order they
// were submitted, so that their transport calls (which Gloo matches by sequence) are
// issued in the same order on every rank, while the caller goes on (DDP overlaps
// bucket i's aggregation with the backward pass of the buckets after it).
//
// submit() returns at once with a Work whose future completes with the given tensors
// when the job has run, or with the job's exception. Futures complete on the worker
// thread, so their callbacks run there; a job submitted from there (a callback that
// issues the next collective and waits for it, as PowerSGD's hook does) runs at once,
// in the callback, instead of waiting behind the queue for a thread that waits for it. drain() waits until every
// submitted job has finished: a caller that is about to issue a transport call of its
// own calls it first, so that the call cannot overtake a queued one. The thread starts
// with the first job; the destructor lets queued jobs finish, then joins it.
//
// Tensors on an accelerator (CUDA): the job runs on the worker's side stream of their
// device (work/lent_stream.h: on CUDA a stream of gradzip's own, at the greatest
// priority, which no user or library is handed), made current on the worker thread with
// that device, after the work already queued on the caller's current stream (an event
// recorded at submit() and waited for by the side stream). Its future is made with the
// device and completed on the side stream as soon as the job has queued its last work:
// waiting on it (Work.wait(), DDP, then()) makes the waiter's current stream wait for the
// result without blocking the waiter's host thread for the device's part. The worker
// thread then synchronizes the side stream before it lets go of the job (whose captures
// may be read by that work) and takes the next one, so a finished job's device work is
// done too (drain() covers it). Host synchronizations inside a job block the worker
// thread, not the caller.
//
// A Work's wait(timeout) raises when the job has not finished within the timeout (it
// goes on in the background). abort() fails every queued and running job's future at
// once, so a caller blocked in wait() raises instead of waiting for a peer that will
// never answer; a running job's own transport call ends by its timeout, its result
// ignored; later submits raise.
//
// Completing a job's future and letting go of the job hold a pass of the exit gate
// (work/exit_gate.h): once the interpreter has begun to exit, a job that finishes is
// kept as it is, neither completed nor freed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "work/lent_stream.h"

namespace gradzip {

class OrderedWorker {
 public:
  OrderedWorker() = default;
  ~OrderedWorker();
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  // Queues `job`; the returned Work's future holds `tensors` once it has run. Tensors on
  // an accelerator must share one device.
  c10::intrusive_ptr<c10d::Work> submit(std::vector<at::Tensor> tensors, std::function<void()> job);
  // Returns when every job submitted so far has finished (on the worker thread: at once,
  // as every job before the running one has).
  void drain();
  // Fails every unfinished job with `reason`; submit() raises it from now on.
  void abort(const std::string& reason);

 private:
  struct Job {
    std::function<void()> run;
    std::vector<at::Tensor> tensors;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    // Set by whoever completes the future first: the job, or abort().
    std::shared_ptr<std::atomic<bool>> settled = std::make_shared<std::atomic<bool>>(false);
    std::optional<c10::Stream> stream = std::nullopt;  // current while it runs and completes: device tensors' side stream
  };
  void loop();
  // Runs the job and completes its future, holding an exit_gate pass for the completion.
  void run(Job& job);
  // Drops the job's references under a pass (work/exit_gate.h), or keeps them once the
  // interpreter is exiting.
  void let_go(Job& job);
  // The side stream of `device`'s jobs (lent on first use, kept until the worker goes).
  c10::Stream side_stream(c10::Device device);

  std::mutex mutex_;
  std::condition_variable wake_;  // a job was queued, or stopping
  std::condition_variable idle_;  // the queue emptied and no job runs
  std::deque<Job> jobs_;
  bool running_ = false;
  bool stopping_ = false;
  std::string aborted_;  // the reason, once aborted
  Job* current_ = nullptr;  // the running job (worker thread's), for abort()
  std::vector<std::unique_ptr<LentStream>> side_streams_;
  std::thread thread_;
};

}  // namespace gradzip
