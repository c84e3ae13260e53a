#include "c10d/checked_p2p.h"

#include <c10/util/Exception.h>

#include <mutex>

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

// The header's receive, then the data's, posted once the header is in.
class RecvWork final : public c10d::Work {
 public:
  RecvWork(c10::intrusive_ptr<c10d::Backend> transport, at::Tensor tensor, int src_rank, int tag)
      : Work(-1, c10d::OpType::RECV),
        transport_(std::move(transport)),
        tensor_(std::move(tensor)),
        header_({at::empty({3}, at::kLong)}),
        src_(src_rank),
        tag_(tag) {
    header_work_ = src_ < 0 ? transport_->recvAnysource(header_, tag_) : transport_->recv(header_, src_, tag_);
  }

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(mutex_);
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
    if (header_work_->exception()) return header_work_->exception();
    return data_work_ ? data_work_->exception() : nullptr;
  }
  int sourceRank() const override { return source_; }
  std::vector<at::Tensor> result() override { return {tensor_}; }
  // Posts the data's receive as soon as the header is in, when the transport's work has
  // a future (MPI's): a large send can complete only once its receive is posted, so a
  // rank that waits for its sends before its receives would otherwise wait forever.
  // Gloo's has none, and needs none: its sends complete unreceived; wait() posts it.
  void post_data_when_header_arrives() {
    c10::intrusive_ptr<c10::ivalue::Future> header;
    try {
      header = header_work_->getFuture();
    } catch (const c10::Error&) {
      return;
    }
    header->addCallback([self = c10::intrusive_ptr<RecvWork>::reclaim_copy(this)](c10::ivalue::Future& done) {
      if (done.hasError()) return;
      std::lock_guard<std::mutex> lock(self->mutex_);
      if (!self->data_work_) self->post_data();
    });
  }
  bool wait(std::chrono::milliseconds timeout) override {
    header_work_->wait(timeout);
    c10::intrusive_ptr<c10d::Work> data;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!data_work_) post_data();
      data = data_work_;
    }
    data->wait(timeout);
    if (mismatch_) std::rethrow_exception(mismatch_);
    return true;
  }
  void abort() override {
    header_work_->abort();
    std::lock_guard<std::mutex> lock(mutex_);
    if (data_work_) data_work_->abort();
  }

 private:
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
  }

  c10::intrusive_ptr<c10d::Backend> transport_;
  at::Tensor tensor_;
  std::vector<at::Tensor> header_;
  int src_, tag_;
  int source_ = -1;
  mutable std::mutex mutex_;
  c10::intrusive_ptr<c10d::Work> header_work_, data_work_;
  std::exception_ptr mismatch_;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> checked_send(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int dst_rank, int tag) {
  std::vector<at::Tensor> header = {header_of(tensor)};
  auto header_work = transport->send(header, dst_rank, tag);
  std::vector<at::Tensor> data = {std::move(tensor)};
  return c10::make_intrusive<SendWork>(std::move(header_work), transport->send(data, dst_rank, tag));
}

c10::intrusive_ptr<c10d::Work> checked_recv(const c10::intrusive_ptr<c10d::Backend>& transport, at::Tensor tensor,
                                            int src_rank, int tag) {
  auto work = c10::make_intrusive<RecvWork>(transport, std::move(tensor), src_rank, tag);
  work->post_data_when_header_arrives();
  return work;
}

}  // namespace gradzip
