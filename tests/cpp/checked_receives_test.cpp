// CheckedReceives over an in-process transport: a receive completes through its threads,
// and after stop() and join() no thread holds the application's tensor any more (a
// thread that let go of it while the interpreter exits aborts the process).
#include "c10d/checked_p2p.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "work/future_work.h"

namespace gradzip {
namespace {

using namespace std::chrono_literals;

// Matches sends to receives by tag alone (the test plays both ranks). Its works cannot
// be aborted, as the MPI transport's cannot; shutdown() fails the receives still posted.
class MailboxTransport final : public c10d::Backend {
 public:
  MailboxTransport() : c10d::Backend(0, 2) {}
  const std::string getBackendName() const override { return "mailbox"; }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int, int tag) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto waiting = posted_.find(tag);
    if (waiting != posted_.end()) {
      deliver(tensors.front(), waiting->second);
      posted_.erase(waiting);
    } else {
      sent_.emplace(tag, tensors.front().clone());
    }
    return completed_work();
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int, int tag) override {
    Posted receive{tensors.front(), make_future()};
    std::lock_guard<std::mutex> lock(mutex_);
    const auto message = sent_.find(tag);
    if (message != sent_.end()) {
      deliver(message->second, receive);
      sent_.erase(message);
    } else {
      posted_.emplace(tag, receive);
    }
    return c10::make_intrusive<FutureWork>(receive.future);
  }

  void shutdown() override {
    std::multimap<int, Posted> posted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      posted.swap(posted_);
    }
    for (auto& [tag, receive] : posted) {
      receive.future->setError(std::make_exception_ptr(std::runtime_error("mailbox: shut down")));
    }
  }

 private:
  struct Posted {
    at::Tensor into;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };
  static c10::intrusive_ptr<c10::ivalue::Future> make_future() {
    return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  }
  static c10::intrusive_ptr<c10d::Work> completed_work() {
    auto future = make_future();
    future->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return c10::make_intrusive<FutureWork>(future);
  }
  static void deliver(const at::Tensor& message, Posted& receive) {
    receive.into.copy_(message);
    receive.future->markCompleted(c10::IValue(std::vector<at::Tensor>{receive.into}));
  }

  std::mutex mutex_;
  std::multimap<int, at::Tensor> sent_;
  std::multimap<int, Posted> posted_;
};

TEST(CheckedReceivesTest, AfterStopAndJoinNoThreadHoldsTheTensor) {
  for (int round = 0; round < 200; ++round) {
    auto transport = c10::make_intrusive<MailboxTransport>();
    auto receives = CheckedReceives::create(10s);
    at::Tensor tensor = at::zeros({6});
    auto work = receives->recv(transport, tensor, 1, 5);
    checked_send(transport, at::arange(6, at::kFloat), 1, 5)->wait();
    ASSERT_TRUE(work->wait());
    ASSERT_TRUE(tensor.equal(at::arange(6, at::kFloat)));
    work.reset();
    receives->stop("the test stopped it");
    transport->shutdown();
    ASSERT_TRUE(receives->join(10s));
    // Only this test's own reference is left: the threads let go of theirs before join().
    ASSERT_EQ(tensor.use_count(), 1) << "round " << round;
  }
}

TEST(CheckedReceivesTest, JoinWaitsForAWorkItsTransportEnds) {
  auto transport = c10::make_intrusive<MailboxTransport>();
  auto receives = CheckedReceives::create(10s);
  at::Tensor tensor = at::zeros({3});
  auto work = receives->recv(transport, tensor, 1, 2);  // nobody sends: its header receive stays posted
  receives->stop("the test stopped it");
  // The transport cannot abort the posted header receive: a thread still waits for it.
  EXPECT_FALSE(receives->join(50ms));
  EXPECT_THROW(work->wait(), c10::Error);  // stop() failed the receive itself at once
  transport->shutdown();
  EXPECT_TRUE(receives->join(10s));
  work.reset();
  EXPECT_EQ(tensor.use_count(), 1);
}

}  // namespace
}  // namespace gradzip
