#include "c10d/checked_p2p.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <utility>

namespace gradzip {
namespace {

constexpr int64_t kHeaderMagic = 0x475A5032;  // "GZP2"

at::Tensor header_of(const at::Tensor& tensor) {
  return at::tensor({kHeaderMagic, static_cast<int64_t>(tensor.scalar_type()), tensor.numel()}, at::kLong);
}

std::string describe(int64_t dtype, int64_t numel) {
  return std::to_string(numel) + " elements of " + c10::toString(static_cast<at::ScalarType>(dtype));
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

// The header's receive, then the data's, posted once the header is in. The header's
// receive waits for the receive before it from the same rank with the same tag to post
// its data's (start()), so that each header message meets a header receive.
class CheckedRecvWork final : public c10d::Work {
 public:
  CheckedRecvWork(c10::intrusive_ptr<c10d::Backend> transport, at::Tensor tensor, int src_rank, int tag)
      : Work(-1, c10d::OpType::RECV),
        transport_(std::move(transport)),
        tensor_(std::move(tensor)),
        header_({at::empty({3}, at::kLong)}),
        src_(src_rank),
        tag_(tag) {}

  // Posts the header's receive now, or once `before` has posted its data's receive.
  void start(const c10::intrusive_ptr<CheckedRecvWork>& before) {
    if (before) {
      std::lock_guard<std::mutex> lock(before->mutex_);
      if (!before->data_work_) {
        before->next_ = c10::intrusive_ptr<CheckedRecvWork>::reclaim_copy(this);
        before_ = before;
        return;
      }
    }
    post_header();
  }

  bool isCompleted() override {
    c10::intrusive_ptr<CheckedRecvWork> before;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!header_work_) before = before_;
    }
    if (before) before->isCompleted();  // may post its data's receive, and so this header's
    std::lock_guard<std::mutex> lock(mutex_);
    if (!header_work_) return false;
    if (!data_work_ && header_work_->isCompleted() && header_work_->isSuccess()) post_data();
    return data_work_ && data_work_->isCompleted();
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return !mismatch_ && data_work_ && data_work_->isSuccess();
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mismatch_) return mismatch_;
    if (header_work_ && header_work_->exception()) return header_work_->exception();
    return data_work_ ? data_work_->exception() : nullptr;
  }
  int sourceRank() const override { return source_; }
  std::vector<at::Tensor> result() override { return {tensor_}; }
  bool wait(std::chrono::milliseconds timeout) override {
    drive(timeout);
    c10::intrusive_ptr<c10d::Work> data;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      data = data_work_;
    }
    data->wait(timeout);
    if (mismatch_) std::rethrow_exception(mismatch_);
    return true;
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (header_work_) header_work_->abort();
    if (data_work_) data_work_->abort();
  }

 private:
  void post_header() {
    c10::intrusive_ptr<c10d::Work> header_work;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      header_work_ = src_ < 0 ? transport_->recvAnysource(header_, tag_) : transport_->recv(header_, src_, tag_);
      header_work = header_work_;
      before_.reset();
    }
    // The data's receive goes up as soon as the header is in, when the transport's work
    // has a future (MPI's): a large send completes only once its receive is posted, so a
    // rank that waits for its sends before its receives would wait forever. Gloo's has
    // none and needs none (its sends complete unreceived): wait() posts it.
    c10::intrusive_ptr<c10::ivalue::Future> arrived;
    try {
      arrived = header_work->getFuture();
    } catch (const c10::Error&) {
      return;
    }
    arrived->addCallback([self = c10::intrusive_ptr<CheckedRecvWork>::reclaim_copy(this)](c10::ivalue::Future& done) {
      if (done.hasError()) return;
      std::lock_guard<std::mutex> lock(self->mutex_);
      if (!self->data_work_) self->post_data();
    });
  }

  // Returns once the data's receive is posted: the receives before this one first.
  void drive(std::chrono::milliseconds timeout) {
    c10::intrusive_ptr<CheckedRecvWork> before;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!header_work_) before = before_;
    }
    if (before) before->drive(timeout);  // its data's receive posted, ours is
    c10::intrusive_ptr<c10d::Work> header_work;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (data_work_) return;  // the header is in: a Gloo work must not be waited for twice
      header_work = header_work_;
    }
    header_work->wait(timeout);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!data_work_) post_data();
  }

  // Checks the header and posts the data's receive (into a scratch buffer on a mismatch).
  void post_data() {
    source_ = src_ < 0 ? header_work_->sourceRank() : src_;
    const int64_t* h = header_.front().data_ptr<int64_t>();
    std::vector<at::Tensor> into = {tensor_};
    if (h[0] != kHeaderMagic) {
      mismatch_ = std::make_exception_ptr(c10::Error(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          "gradzip: recv from rank " + std::to_string(source_) + " (tag " + std::to_string(tag_) +
              ") got no gradzip send header: both ranks must use gradzip groups with the same validate setting"));
      data_work_ = header_work_;  // nothing more can be read in step
      start_next();
      return;
    }
    const bool known = h[1] >= 0 && h[1] < static_cast<int64_t>(at::ScalarType::NumOptions) && h[2] >= 0;
    if (!known) {
      mismatch_ = std::make_exception_ptr(c10::Error(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          "gradzip: recv from rank " + std::to_string(source_) + " (tag " + std::to_string(tag_) +
              ") got a corrupt send header (dtype " + std::to_string(h[1]) + ", " + std::to_string(h[2]) +
              " elements)"));
      data_work_ = header_work_;
      start_next();
      return;
    }
    const bool same = h[1] == static_cast<int64_t>(tensor_.scalar_type()) && h[2] == tensor_.numel();
    if (!same) {
      mismatch_ = std::make_exception_ptr(c10::Error(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          "gradzip: recv from rank " + std::to_string(source_) + " (tag " + std::to_string(tag_) + ") expects " +
              describe(static_cast<int64_t>(tensor_.scalar_type()), tensor_.numel()) + ", rank " +
              std::to_string(source_) + " sent " + describe(h[1], h[2]) +
              "; the data was received and dropped, the tensor is unchanged"));
      into = {at::empty({h[2]}, at::dtype(static_cast<at::ScalarType>(h[1])))};
    }
    data_work_ = transport_->recv(into, source_, tag_);
    start_next();
  }
  // The receive after this one from the same rank and tag may post its header's now.
  void start_next() {
    if (next_) std::exchange(next_, {})->post_header();
  }

  c10::intrusive_ptr<c10d::Backend> transport_;
  at::Tensor tensor_;
  std::vector<at::Tensor> header_;
  int src_, tag_;
  int source_ = -1;
  mutable std::mutex mutex_;
  c10::intrusive_ptr<c10d::Work> header_work_, data_work_;  // null until posted
  c10::intrusive_ptr<CheckedRecvWork> before_;  // until this header's receive is posted
  c10::intrusive_ptr<CheckedRecvWork> next_;    // until this data's receive is posted
  std::exception_ptr mismatch_;
};

c10::intrusive_ptr<c10d::Work> checked_send(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int dst_rank, int tag) {
  std::vector<at::Tensor> header = {header_of(tensor)};
  auto header_work = transport->send(header, dst_rank, tag);
  std::vector<at::Tensor> data = {std::move(tensor)};
  return c10::make_intrusive<SendWork>(std::move(header_work), transport->send(data, dst_rank, tag));
}

CheckedReceives::CheckedReceives() = default;
CheckedReceives::~CheckedReceives() = default;

c10::intrusive_ptr<c10d::Work> CheckedReceives::recv(const c10::intrusive_ptr<c10d::Backend>& transport,
                                                     at::Tensor tensor, int src_rank, int tag) {
  auto work = c10::make_intrusive<CheckedRecvWork>(transport, std::move(tensor), src_rank, tag);
  c10::intrusive_ptr<CheckedRecvWork> before;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (last_.size() > 4096) std::erase_if(last_, [](const auto& entry) { return entry.second.expired(); });
    const auto key = std::make_pair(src_rank, tag);
    const auto found = last_.find(key);
    if (found != last_.end()) before = found->second.lock();
    last_.insert_or_assign(key, c10::weak_intrusive_ptr<CheckedRecvWork>(work));
  }
  work->start(before);
  return work;
}

}  // namespace gradzip
