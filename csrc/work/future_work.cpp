#include "work/future_work.h"

#include <condition_variable>
#include <mutex>

namespace gradzip {

std::vector<at::Tensor> FutureWork::result() {
  future_->waitAndThrow();
  return future_->value().toTensorVector();
}

bool FutureWork::wait(std::chrono::milliseconds timeout) {
  const bool own = timeout != kNoTimeout;
  if (!own) timeout = default_timeout_;
  if (timeout != kNoTimeout && !future_->completed()) {
    auto done = std::make_shared<std::pair<std::mutex, std::condition_variable>>();
    future_->addCallback([done](c10::ivalue::Future&) {
      std::lock_guard<std::mutex> lock(done->first);
      done->second.notify_all();
    });
    std::unique_lock<std::mutex> lock(done->first);
    const bool finished = done->second.wait_for(lock, timeout, [this] { return future_->completed(); });
    TORCH_CHECK(finished, "gradzip: the call did not finish within ", own ? "Work.wait's" : "the group's",
                " timeout of ", timeout.count(), " ms (it goes on in the background)");
  }
  future_->waitAndThrow();
  return true;
}

int FutureWork::sourceRank() const {
  TORCH_CHECK(source_, "gradzip: sourceRank() belongs to the work of a receive from any source");
  TORCH_CHECK(future_->completed() && !future_->hasError(),
              "gradzip: sourceRank() is known once the receive has completed");
  return source_->load();
}

}  // namespace gradzip
