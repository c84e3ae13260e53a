#include "c10d/checked_p2p.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <thread>

#include "transport/tag_space.h"
#include "work/exit_gate.h"
#include "work/future_work.h"

namespace gradzip {
namespace {

constexpr int64_t kHeaderMagic = 0x475A5032;  // "GZP2"
constexpr int64_t kDrainSlack = int64_t{1} << 20;
// How long a lane waits for a transport work: for all practical purposes unbounded (a
// header receive posted ahead may wait for the next message a long while); the
// application's wait() applies the group's timeout.
constexpr std::chrono::milliseconds kLaneWait = std::chrono::hours(24 * 365);

at::Tensor header_of(const at::Tensor& tensor) {
  return at::tensor({kHeaderMagic, static_cast<int64_t>(tensor.scalar_type()), tensor.numel()}, at::kLong);
}

std::string describe(int64_t dtype, int64_t numel) {
  return std::to_string(numel) + " elements of " + c10::toString(static_cast<at::ScalarType>(dtype));
}

std::exception_ptr error(const std::string& what) {
  return std::make_exception_ptr(c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, what));
}

void check_tag(const c10d::Backend& transport, int tag, const char* op) {
  const int offset = data_tag_offset(transport);
  TORCH_CHECK(tag >= 0 && tag < offset, "gradzip: checked ", op, " over ", transport.getBackendName(),
              " takes tags 0..", offset - 1, ", got ", tag, " (a message's data travels on its tag + ", offset, ")");
}

// Removes and returns the first element of `queue` that `fits`, or null.
template <typename T, typename Fits>
std::shared_ptr<T> take_first(std::deque<std::shared_ptr<T>>& queue, const Fits& fits) {
  const auto found = std::find_if(queue.begin(), queue.end(), fits);
  if (found == queue.end()) return nullptr;
  auto item = *found;
  queue.erase(found);
  return item;
}

void abort_quietly(c10d::Work& work) {
  try {
    work.abort();
  } catch (const std::exception&) {  // a transport whose works cannot abort ends them at its shutdown
  }
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

int data_tag_offset(const c10d::Backend& transport) { return largest_tag(transport) / 2 + 1; }

bool drainable_announcement(int64_t announced, int64_t expected) {
  return announced <= kDrainSlack || (announced - kDrainSlack + 3) / 4 <= expected;
}

c10::intrusive_ptr<c10d::Work> checked_send(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int dst_rank, int tag) {
  check_tag(*transport, tag, "send");
  std::vector<at::Tensor> header = {header_of(tensor)};
  auto header_work = transport->send(header, dst_rank, tag);
  std::vector<at::Tensor> data = {std::move(tensor)};
  auto data_work = transport->send(data, dst_rank, tag + data_tag_offset(*transport));
  return c10::make_intrusive<SendWork>(std::move(header_work), std::move(data_work));
}

struct CheckedReceives::Receive {
  c10::intrusive_ptr<c10d::Backend> transport;
  at::Tensor tensor;
  int src, tag;
  c10::intrusive_ptr<c10::ivalue::Future> future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  std::shared_ptr<std::atomic<int>> source = std::make_shared<std::atomic<int>>(-1);

  bool accepts(int rank) const { return src < 0 || src == rank; }
  std::string what() const {
    return "gradzip: recv from " + (src < 0 ? std::string("any rank") : "rank " + std::to_string(src)) + " (tag " +
           std::to_string(tag) + ") on rank " + std::to_string(transport->getRank());
  }
};

struct CheckedReceives::Header {
  at::Tensor values = at::empty({3}, at::kLong);
  int source = -1;  // known once it is in
};

std::shared_ptr<CheckedReceives> CheckedReceives::create(std::chrono::milliseconds timeout) {
  return std::shared_ptr<CheckedReceives>(new CheckedReceives(timeout));
}

void CheckedReceives::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeout_ = timeout;
}

c10::intrusive_ptr<c10d::Work> CheckedReceives::recv(const c10::intrusive_ptr<c10d::Backend>& transport,
                                                     at::Tensor tensor, int src_rank, int tag) {
  TORCH_CHECK(tensor.layout() == at::kStrided, "gradzip: recv needs a dense (strided) tensor, not ", tensor.layout());
  TORCH_CHECK(src_rank < transport->getSize(), "gradzip: recv from rank ", src_rank, " in a group of ",
              transport->getSize());
  check_tag(*transport, tag, "recv");
  auto receive = std::make_shared<Receive>(Receive{transport, std::move(tensor), src_rank < 0 ? -1 : src_rank, tag});
  Done done;
  std::chrono::milliseconds timeout;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "gradzip: recv on a process group that was shut down or aborted");
    timeout = timeout_;
    if (auto refused = broken(receive->src, tag)) {
      done.push_back([receive, refused] { finish(receive, refused); });
    } else {
      TagState& state = tags_[tag];
      if (const auto header = take_first(state.held, [&](const auto& h) { return receive->accepts(h->source); })) {
        take(*header, receive, done);
      } else {
        state.pending.push_back(receive);
        try {
          want_header(transport, receive->src, tag);
        } catch (const std::exception&) {
          state.pending.pop_back();
          throw;
        }
      }
    }
  }
  for (const auto& finish_one : done) finish_one();
  return c10::make_intrusive<FutureWork>(receive->future, receive->source, timeout);
}

void CheckedReceives::want_header(const c10::intrusive_ptr<c10d::Backend>& transport, int src, int tag) {
  bool& posting = tags_[tag].posting[src];
  if (posting) return;
  auto header = std::make_shared<Header>();
  std::vector<at::Tensor> into = {header->values};
  auto work = src < 0 ? transport->recvAnysource(into, tag) : transport->recv(into, src, tag);
  posting = true;
  enqueue({LaneKind::kHeaders, src, tag},
          Step{work, [self = shared_from_this(), transport, src, tag, header](c10d::Work& done_work,
                                                                              std::exception_ptr failure) {
                 Done done;
                 {
                   std::lock_guard<std::mutex> lock(self->mutex_);
                   self->header_in(transport, src, tag, done_work, header, failure, done);
                 }
                 for (const auto& finish_one : done) finish_one();
               }});
}

void CheckedReceives::header_in(const c10::intrusive_ptr<c10d::Backend>& transport, int src, int tag,
                                c10d::Work& work, const std::shared_ptr<Header>& header, std::exception_ptr failure,
                                Done& done) {
  if (stopping_) return;  // stop() failed the receives
  TagState& state = tags_[tag];
  state.posting[src] = false;
  if (failure) {
    if (src >= 0) {
      break_stream(tag, src, failure, done);
    } else {
      fail_pending(tag, src, failure, done);
    }
    return;
  }
  header->source = src < 0 ? work.sourceRank() : src;
  const int source = header->source;
  const auto accepts_source = [source](const auto& receive) { return receive->accepts(source); };
  const int64_t* h = header->values.data_ptr<int64_t>();
  const bool known = h[1] >= 0 && h[1] < static_cast<int64_t>(at::ScalarType::NumOptions) &&
                     h[1] != static_cast<int64_t>(at::ScalarType::Undefined) && h[2] >= 0 &&
                     h[2] <= std::numeric_limits<int64_t>::max() / 16;
  if (h[0] != kHeaderMagic || !known) {
    const std::string why = h[0] != kHeaderMagic
                                ? "got no gradzip send header (both ranks must use gradzip groups with the same "
                                  "validate setting)"
                                : "got a corrupt send header (dtype " + std::to_string(h[1]) + ", " +
                                      std::to_string(h[2]) + " elements)";
    const auto out_of_step = error("gradzip: a message from rank " + std::to_string(source) + " (tag " +
                                   std::to_string(tag) + ") on rank " + std::to_string(transport->getRank()) + " " +
                                   why + "; every receive from rank " + std::to_string(source) + " with tag " +
                                   std::to_string(tag) + " fails from now on (the stream is out of step)");
    if (const auto receive = take_first(state.pending, accepts_source)) {
      done.push_back([receive, out_of_step] { finish(receive, out_of_step); });
    }
    break_stream(tag, source, out_of_step, done);
  } else if (!broken(source, tag)) {
    if (const auto receive = take_first(state.pending, accepts_source)) {
      take(*header, receive, done);
    } else {
      state.held.push_back(header);
    }
  }
  // The lane's next header: posted ahead on Gloo, whose receives wait as long as asked;
  // elsewhere only for a receive that still wants one.
  const bool wanted = std::any_of(state.pending.begin(), state.pending.end(),
                                  [&](const auto& receive) { return receive->src == src; });
  const bool ahead = src >= 0 && transport->getBackendName() == "gloo";
  if ((wanted || ahead) && !broken(src, tag)) {
    try {
      want_header(transport, src, tag);
    } catch (const std::exception&) {
      fail_pending(tag, src, std::current_exception(), done);
    }
  }
}

void CheckedReceives::take(const Header& header, const std::shared_ptr<Receive>& receive, Done& done) {
  const int source = header.source;
  receive->source->store(source);
  const int64_t* h = header.values.data_ptr<int64_t>();
  const auto dtype = static_cast<at::ScalarType>(h[1]);
  const at::Tensor& tensor = receive->tensor;
  // A non-contiguous tensor takes the data through a contiguous copy (Gloo refuses one).
  at::Tensor into = tensor.is_contiguous() ? tensor : at::empty(tensor.sizes(), tensor.options());
  std::exception_ptr mismatch;
  if (dtype != tensor.scalar_type() || h[2] != tensor.numel()) {
    const int64_t announced = h[2] * static_cast<int64_t>(c10::elementSize(dtype));
    const std::string sides = receive->what() + " expects " +
                              describe(static_cast<int64_t>(tensor.scalar_type()), tensor.numel()) + ", rank " +
                              std::to_string(source) + " sent " + describe(h[1], h[2]);
    if (!drainable_announcement(announced, static_cast<int64_t>(tensor.nbytes()))) {
      const auto refused = error(sides + ": more than 4x the receive's bytes + 1 MiB, so it is not received; every "
                                 "receive from rank " + std::to_string(source) + " with tag " +
                                 std::to_string(receive->tag) + " fails from now on (the stream is out of step)");
      done.push_back([receive, refused] { finish(receive, refused); });
      break_stream(receive->tag, source, refused, done);
      return;
    }
    mismatch = error(sides + "; the data was received and dropped, the tensor is unchanged");
    into = at::empty({h[2]}, at::dtype(dtype));
  }
  std::vector<at::Tensor> buffer = {into};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = receive->transport->recv(buffer, source, receive->tag + data_tag_offset(*receive->transport));
  } catch (const std::exception&) {
    const auto failure = std::current_exception();
    done.push_back([receive, failure] { finish(receive, failure); });
    return;
  }
  enqueue({LaneKind::kData, source, receive->tag},
          Step{work, [receive, into, mismatch](c10d::Work&, std::exception_ptr failure) {
                 if (!failure && !mismatch && !into.is_same(receive->tensor)) receive->tensor.copy_(into);
                 finish(receive, failure ? failure : mismatch);
               }});
}

void CheckedReceives::break_stream(int tag, int source, std::exception_ptr why, Done& done) {
  broken_[tag].emplace(source, why);
  auto& held = tags_[tag].held;
  held.erase(std::remove_if(held.begin(), held.end(), [&](const auto& header) { return header->source == source; }),
             held.end());
  fail_pending(tag, source, why, done);
}

void CheckedReceives::fail_pending(int tag, int src, std::exception_ptr failure, Done& done) {
  auto& pending = tags_[tag].pending;
  for (auto it = pending.begin(); it != pending.end();) {
    if ((*it)->src == src) {
      done.push_back([receive = *it, failure] { finish(receive, failure); });
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
}

void CheckedReceives::finish(const std::shared_ptr<Receive>& receive, std::exception_ptr failure) {
  if (failure) {
    receive->future->setError(failure);
  } else {
    receive->future->markCompleted(c10::IValue(std::vector<at::Tensor>{receive->tensor}));
  }
}

void CheckedReceives::enqueue(const LaneKey& key, Step step) {
  Lane& lane = lanes_[key];
  lane.steps.push_back(std::move(step));
  if (lane.scheduled) return;
  lane.scheduled = true;
  ready_.push_back(key);
  if (idle_ > 0) {
    --idle_;
    wake_.notify_one();
  } else {
    ++threads_;
    std::thread([self = shared_from_this()]() mutable {
      if (!self->serve()) exit_gate::keep(std::move(self));  // the interpreter is exiting: the lanes stay
    }).detach();
  }
}

std::exception_ptr CheckedReceives::broken(int src, int tag) const {
  const auto found = broken_.find(tag);
  if (found == broken_.end() || src < 0) return nullptr;  // any source: the others may still send
  const auto from = found->second.find(src);
  return from == found->second.end() ? nullptr : from->second;
}

bool CheckedReceives::serve() {
  std::unique_lock<std::mutex> lock(mutex_);
  bool open = true;
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !ready_.empty(); });
    if (ready_.empty()) break;
    const LaneKey key = ready_.front();
    ready_.pop_front();
    open = run_lane(lock, key);
    if (!open || (stopping_ && ready_.empty())) break;
    ++idle_;
  }
  --threads_;
  ended_.notify_all();
  return open;
}

bool CheckedReceives::run_lane(std::unique_lock<std::mutex>& lock, const LaneKey& key) {
  Lane& lane = lanes_[key];
  while (!lane.steps.empty()) {
    Step step = lane.steps.front();  // stays queued while in flight: stop() aborts it there
    lock.unlock();
    std::exception_ptr failure;
    bool finished = false;
    try {
      finished = step.work->wait(kLaneWait);
    } catch (const std::exception&) {
      failure = std::current_exception();
    }
    if (!failure && !finished) {
      std::lock_guard<std::mutex> relock(mutex_);
      failure = error(stop_reason_.empty() ? "gradzip: a receive was aborted" : stop_reason_);
    }
    const exit_gate::Pass pass = exit_gate::enter();
    if (!pass) {  // the interpreter is exiting: what the lane holds stays as it is
      exit_gate::keep(std::make_shared<Step>(std::move(step)));
      lock.lock();
      return false;
    }
    step.then(*step.work, failure);
    step = Step();
    lock.lock();
    lane.steps.pop_front();
  }
  lanes_.erase(key);
  return true;
}

void CheckedReceives::stop(const std::string& reason) {
  std::vector<c10::intrusive_ptr<c10d::Work>> posted;
  Done done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    stop_reason_ = reason;
    for (const auto& [key, lane] : lanes_) {
      for (const auto& step : lane.steps) posted.push_back(step.work);
    }
    const auto failure = error(reason);
    for (auto& [tag, state] : tags_) {
      for (const auto& receive : state.pending) done.push_back([receive, failure] { finish(receive, failure); });
    }
    tags_.clear();
  }
  wake_.notify_all();
  for (const auto& work : posted) abort_quietly(*work);
  for (const auto& finish_one : done) finish_one();
}

bool CheckedReceives::join(std::chrono::milliseconds within) {
  std::unique_lock<std::mutex> lock(mutex_);
  return ended_.wait_for(lock, within, [this] { return threads_ == 0; });
}

}  // namespace gradzip
