#include "c10d/checked_p2p.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <limits>
#include <thread>

#include "aggregate/future_work.h"

namespace gradzip {
namespace {

constexpr int64_t kHeaderMagic = 0x475A5032;  // "GZP2"
constexpr int64_t kDrainSlack = int64_t{1} << 20;

at::Tensor header_of(const at::Tensor& tensor) {
  return at::tensor({kHeaderMagic, static_cast<int64_t>(tensor.scalar_type()), tensor.numel()}, at::kLong);
}

std::string describe(int64_t dtype, int64_t numel) {
  return std::to_string(numel) + " elements of " + c10::toString(static_cast<at::ScalarType>(dtype));
}

std::exception_ptr error(const std::string& what) {
  return std::make_exception_ptr(c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, what));
}

// Both sends: done when both are.
class SendWork final : public c10d::Work {
 public:
  SendWork(c10::intrusive_ptr<c10d::Work> header, c10::intrusive_ptr<c10d::Work> data)
      : Work(-1, c10d::OpType::SEND), header_(std::move(header)), data_(std::move(data)) {}
  bool isCompleted() override { return header_->isCompleted() && data_->isCompleted(); }
  bool isSuccess() const override { return header_->isSuccess() && data_->isSuccess(); }
  std::exception_ptr exception() const override {
    return header_->exception() ? header_->exception() : data_->exception();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    header_->wait(timeout);
    return data_->wait(timeout);
  }
  void abort() override {
    header_->abort();
    data_->abort();
  }

 private:
  c10::intrusive_ptr<c10d::Work> header_, data_;
};

}  // namespace

bool drainable_announcement(int64_t announced, int64_t expected) {
  return announced <= kDrainSlack || (announced - kDrainSlack + 3) / 4 <= expected;
}

c10::intrusive_ptr<c10d::Work> checked_send(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int dst_rank, int tag) {
  std::vector<at::Tensor> header = {header_of(tensor)};
  auto header_work = transport->send(header, dst_rank, tag);
  std::vector<at::Tensor> data = {std::move(tensor)};
  return c10::make_intrusive<SendWork>(std::move(header_work), transport->send(data, dst_rank, tag));
}

struct CheckedReceives::Receive {
  c10::intrusive_ptr<c10d::Backend> transport;
  at::Tensor tensor;
  int src, tag;
  c10::intrusive_ptr<c10::ivalue::Future> future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  std::shared_ptr<std::atomic<int>> source = std::make_shared<std::atomic<int>>(-1);

  std::string what() const {
    return "recv from " + (src < 0 ? std::string("any rank") : "rank " + std::to_string(src)) + " (tag " +
           std::to_string(tag) + ")";
  }
};

std::shared_ptr<CheckedReceives> CheckedReceives::create() {
  return std::shared_ptr<CheckedReceives>(new CheckedReceives());
}

c10::intrusive_ptr<c10d::Work> CheckedReceives::recv(const c10::intrusive_ptr<c10d::Backend>& transport,
                                                     at::Tensor tensor, int src_rank, int tag) {
  TORCH_CHECK(tensor.layout() == at::kStrided, "gradzip: recv needs a dense (strided) tensor, not ", tensor.layout());
  TORCH_CHECK(src_rank < transport->getSize(), "gradzip: recv from rank ", src_rank, " in a group of ",
              transport->getSize());
  auto receive = std::make_shared<Receive>(Receive{transport, std::move(tensor), src_rank < 0 ? -1 : src_rank, tag});
  auto work = c10::make_intrusive<FutureWork>(receive->future, receive->source);
  std::exception_ptr refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "gradzip: recv on a process group that was shut down or aborted");
    refused = broken(receive->src, tag);
    if (!refused) admit(receive);
  }
  if (refused) receive->future->setError(refused);
  return work;
}

void CheckedReceives::admit(const std::shared_ptr<Receive>& receive) {
  Gate& gate = gates_[receive->tag];
  const bool any_source = receive->src < 0;
  if (gate.waiting.empty() && (gate.running == 0 || gate.any_source == any_source)) {
    gate.any_source = any_source;
    ++gate.running;
    schedule(receive);
  } else {
    gate.waiting.push_back(receive);
  }
}

void CheckedReceives::settle(const Receive& receive) {
  const auto found = gates_.find(receive.tag);
  if (found == gates_.end()) return;  // stopped
  Gate& gate = found->second;
  --gate.running;
  while (!gate.waiting.empty() && (gate.running == 0 || gate.waiting.front()->src < 0 == gate.any_source)) {
    gate.any_source = gate.waiting.front()->src < 0;
    ++gate.running;
    schedule(gate.waiting.front());
    gate.waiting.pop_front();
  }
  if (gate.running == 0) gates_.erase(found);
}

void CheckedReceives::schedule(const std::shared_ptr<Receive>& receive) {
  const LineKey key{receive->src, receive->tag};
  Line& line = lines_[key];
  line.queue.push_back(receive);
  if (line.scheduled) return;
  line.scheduled = true;
  ready_.push_back(key);
  if (idle_ > 0) {
    --idle_;
    wake_.notify_one();
  } else {
    std::thread([self = shared_from_this()] { self->serve(); }).detach();
  }
}

std::exception_ptr CheckedReceives::broken(int src, int tag) const {
  const auto found = broken_.find(tag);
  if (found == broken_.end()) return nullptr;
  if (src < 0) return found->second.begin()->second;  // a header from any of them could be a stray message
  const auto from = found->second.find(src);
  return from == found->second.end() ? nullptr : from->second;
}

void CheckedReceives::serve() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !ready_.empty(); });
    if (ready_.empty()) return;
    const LineKey key = ready_.front();
    ready_.pop_front();
    run_line(lock, key);
    if (stopping_ && ready_.empty()) return;
    ++idle_;
  }
}

void CheckedReceives::run_line(std::unique_lock<std::mutex>& lock, const LineKey& key) {
  Line& line = lines_[key];
  while (!line.queue.empty()) {
    const std::shared_ptr<Receive> receive = line.queue.front();
    std::exception_ptr outcome = stopping_ ? error(stop_reason_) : broken(receive->src, receive->tag);
    if (!outcome) {
      lock.unlock();
      outcome = receive_one(*receive, line);
      lock.lock();
      line.in_flight.reset();
    }
    line.queue.pop_front();
    settle(*receive);
    lock.unlock();
    if (outcome) {
      receive->future->setError(outcome);
    } else {
      receive->future->markCompleted(c10::IValue(std::vector<at::Tensor>{receive->tensor}));
    }
    lock.lock();
  }
  lines_.erase(key);
}

c10::intrusive_ptr<c10d::Work> CheckedReceives::post(Line& line, c10::intrusive_ptr<c10d::Work> work) {
  bool aborted = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    line.in_flight = work;
    aborted = stopping_;
  }
  if (aborted) {
    try {
      work->abort();
    } catch (const std::exception&) {  // a transport whose works cannot abort ends them at its shutdown
    }
  }
  return work;
}

std::exception_ptr CheckedReceives::receive_one(Receive& receive, Line& line) {
  const auto& transport = receive.transport;
  const std::string what = receive.what();
  int source = receive.src;
  // The stream from `source` on this tag is out of step: later receives from it fail too.
  auto out_of_step = [&](const std::string& why) {
    auto failure = error("gradzip: " + what + " on rank " + std::to_string(transport->getRank()) + ": " + why +
                         "; later receives from rank " + std::to_string(source) + " with tag " +
                         std::to_string(receive.tag) + " fail too (the stream is out of step)");
    std::lock_guard<std::mutex> lock(mutex_);
    broken_[receive.tag].emplace(source, failure);
    return failure;
  };
  auto aborted = [&] {
    std::lock_guard<std::mutex> lock(mutex_);
    return error(stop_reason_.empty() ? "gradzip: " + what + " was aborted" : stop_reason_);
  };
  try {
    std::vector<at::Tensor> header = {at::empty({3}, at::kLong)};
    auto arrived = post(line, receive.src < 0 ? transport->recvAnysource(header, receive.tag)
                                              : transport->recv(header, receive.src, receive.tag));
    if (!arrived->wait()) return aborted();
    if (receive.src < 0) source = arrived->sourceRank();
    receive.source->store(source);

    const int64_t* h = header.front().data_ptr<int64_t>();
    if (h[0] != kHeaderMagic) {
      return out_of_step("got no gradzip send header (both ranks must use gradzip groups with the same validate "
                         "setting)");
    }
    const bool known = h[1] >= 0 && h[1] < static_cast<int64_t>(at::ScalarType::NumOptions) && h[2] >= 0 &&
                       h[2] <= std::numeric_limits<int64_t>::max() / 16;
    const auto dtype = static_cast<at::ScalarType>(known ? h[1] : 0);
    if (!known || dtype == at::ScalarType::Undefined) {
      return out_of_step("got a corrupt send header (dtype " + std::to_string(h[1]) + ", " + std::to_string(h[2]) +
                         " elements)");
    }
    const auto& tensor = receive.tensor;
    // A non-contiguous tensor takes the data through a contiguous copy (Gloo refuses one).
    std::vector<at::Tensor> into = {tensor.is_contiguous() ? tensor : at::empty(tensor.sizes(), tensor.options())};
    std::exception_ptr mismatch;
    if (dtype != tensor.scalar_type() || h[2] != tensor.numel()) {
      const int64_t announced = h[2] * static_cast<int64_t>(c10::elementSize(dtype));
      const std::string sides = "expects " + describe(static_cast<int64_t>(tensor.scalar_type()), tensor.numel()) +
                                ", rank " + std::to_string(source) + " sent " + describe(h[1], h[2]);
      if (!drainable_announcement(announced, static_cast<int64_t>(tensor.nbytes()))) {
        return out_of_step(sides + ": more than 4x the receive's bytes + 1 MiB, so it is not received");
      }
      mismatch = error("gradzip: " + what + " on rank " + std::to_string(transport->getRank()) + " " + sides +
                       "; the data was received and dropped, the tensor is unchanged");
      into = {at::empty({h[2]}, at::dtype(dtype))};
    }
    auto data = post(line, transport->recv(into, source, receive.tag));
    if (!data->wait()) return aborted();
    if (!mismatch && !into.front().is_same(tensor)) tensor.copy_(into.front());
    return mismatch;
  } catch (const std::exception&) {
    const auto failure = std::current_exception();
    std::lock_guard<std::mutex> lock(mutex_);
    if (source >= 0) broken_[receive.tag].emplace(source, failure);
    return failure;
  }
}

void CheckedReceives::stop(const std::string& reason) {
  std::vector<c10::intrusive_ptr<c10d::Work>> in_flight;
  std::vector<std::shared_ptr<Receive>> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    stop_reason_ = reason;
    for (auto& [key, line] : lines_) {
      if (line.in_flight) in_flight.push_back(line.in_flight);
    }
    for (auto& [tag, gate] : gates_) waiting.insert(waiting.end(), gate.waiting.begin(), gate.waiting.end());
    gates_.clear();
  }
  wake_.notify_all();
  for (const auto& work : in_flight) {
    try {
      work->abort();
    } catch (const std::exception&) {  // a transport whose works cannot abort ends them at its shutdown
    }
  }
  for (const auto& receive : waiting) receive->future->setError(error(reason));
}

}  // namespace gradzip
