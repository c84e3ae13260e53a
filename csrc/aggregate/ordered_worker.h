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
// A Work's wait(timeout) raises when the job has not finished within the timeout (it
// goes on in the background). abort() fails every queued and running job's future at
// once, so a caller blocked in wait() raises instead of waiting for a peer that will
// never answer; a running job's own transport call ends by its timeout, its result
// ignored; later submits raise.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace gradzip {

class OrderedWorker {
 public:
  OrderedWorker() = default;
  ~OrderedWorker();
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  // Queues `job`; the returned Work's future holds `tensors` once it has run.
  c10::intrusive_ptr<c10d::Work> submit(std::vector<at::Tensor> tensors, std::function<void()> job);
  // Returns when every job submitted so far has finished.
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
  };
  void loop();
  static void run(Job& job);

  std::mutex mutex_;
  std::condition_variable wake_;  // a job was queued, or stopping
  std::condition_variable idle_;  // the queue emptied and no job runs
  std::deque<Job> jobs_;
  bool running_ = false;
  bool stopping_ = false;
  std::string aborted_;  // the reason, once aborted
  Job* current_ = nullptr;  // the running job (worker thread's), for abort()
  // The last finished job's tensors and future, kept (by the worker thread alone) until
  // the next job starts or the destructor's thread drops them: their last reference may
  // be a Python tensor's, and a thread other than the interpreter's own dies taking the
  // GIL once the interpreter is shutting down, which a script that ends right after its
  // last wait() starts while this thread would still be letting go of that job.
  Job finished_;
  std::thread thread_;
};

}  // namespace gradzip
