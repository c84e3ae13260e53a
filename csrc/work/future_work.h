// FutureWork: a c10d::Work over a future that some thread completes later: the
// OrderedWorker's jobs, the MPI transport's calls.
//
// Unlike c10d's Work::create_from_future, wait() raises the future's error (a failed
// all_reduce must not pass for a done one), and wait(timeout) raises when the future is
// not complete within the timeout (the work goes on in the background). result() waits
// and returns the future's tensors. sourceRank() gives the rank a receive-from-any-source
// got its message from, once complete, when the work was made with a `source`.
#pragma once

#include <atomic>
#include <memory>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace gradzip {

class FutureWork final : public c10d::Work {
 public:
  explicit FutureWork(c10::intrusive_ptr<c10::ivalue::Future> future,
                      std::shared_ptr<std::atomic<int>> source = nullptr,
                      std::chrono::milliseconds default_timeout = kNoTimeout)
      : future_(std::move(future)), source_(std::move(source)), default_timeout_(default_timeout) {}
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout) override;
  int sourceRank() const override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<std::atomic<int>> source_;
  std::chrono::milliseconds default_timeout_;
};

}  // namespace gradzip
