#include "transport/host_staged_backend.h"

#include <mutex>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

namespace gradzip {
namespace {

// A contiguous host tensor of t's sizes and dtype: pinned when t is on a GPU, so that
// its copies are DMA transfers.
at::Tensor host_twin(const at::Tensor& t) {
  TORCH_CHECK(t.layout() == at::kStrided, "gradzip host staging: a tensor of layout ", t.layout(),
              " cannot travel through host buffers; only dense tensors do");
  return at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU).pinned_memory(t.is_cuda()));
}

// Waits for what is queued on the calling thread's current stream of each accelerator
// device among `tensors`' devices (nothing for host tensors).
void synchronize_current_streams(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (!t.is_cpu()) c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device()).synchronize();
  }
}

// The caller's tensors of (host buffer, caller's tensor) pairs.
std::vector<at::Tensor> targets_of(const std::vector<std::pair<at::Tensor, at::Tensor>>& outputs) {
  std::vector<at::Tensor> targets;
  targets.reserve(outputs.size());
  for (const auto& output : outputs) targets.push_back(output.second);
  return targets;
}

// The host call's Work, and the caller's outputs its host buffers are copied back into.
class StagedWork final : public c10d::Work {
 public:
  StagedWork(c10::intrusive_ptr<c10d::Work> host, std::vector<at::Tensor> inputs,
             std::vector<std::pair<at::Tensor, at::Tensor>> outputs)
      : host_(std::move(host)), inputs_(std::move(inputs)), outputs_(std::move(outputs)) {}

  bool isCompleted() override {
    if (!host_->isCompleted()) return false;
    if (host_->isSuccess()) copy_back();
    return true;
  }
  bool isSuccess() const override { return host_->isSuccess(); }
  std::exception_ptr exception() const override { return host_->exception(); }
  int sourceRank() const override { return host_->sourceRank(); }
  void abort() override { host_->abort(); }

  bool wait(std::chrono::milliseconds timeout) override {
    if (!host_->wait(timeout)) return false;  // a failed host call raises here, and nothing is copied
    copy_back();
    return true;
  }
  std::vector<at::Tensor> result() override {
    wait(kNoTimeout);
    return targets_of(outputs_);
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto self = c10::intrusive_ptr<StagedWork>::reclaim_copy(this);
    return host_->getFuture()->then(
        [self](c10::ivalue::Future& done) {
          done.value();  // the host call's error becomes this future's
          self->copy_back();
          return c10::IValue(targets_of(self->outputs_));
        },
        c10::ListType::ofTensors());
  }

 private:
  // Once, and complete on the device before it returns (a strided target's copy ends in
  // a kernel), so that any stream the caller then uses reads the result.
  void copy_back() {
    std::call_once(copied_, [this] {
      for (auto& [host, target] : outputs_) target.copy_(host);
      synchronize_current_streams(targets_of(outputs_));
    });
  }

  c10::intrusive_ptr<c10d::Work> host_;
  std::vector<at::Tensor> inputs_;  // host copies the host call reads, alive until it is done
  std::vector<std::pair<at::Tensor, at::Tensor>> outputs_;  // (host buffer, caller's tensor)
  std::once_flag copied_;
};

// One call's host tensors: in() holds a tensor's values, out() is copied back into the
// tensor when the call completes, in_out() both; each also over lists and lists of lists.
class Staging {
 public:
  at::Tensor in(const at::Tensor& t) {
    at::Tensor host = host_twin(t);
    host.copy_(t);
    inputs_.push_back(host);
    return host;
  }
  at::Tensor out(const at::Tensor& t) {
    at::Tensor host = host_twin(t);
    outputs_.emplace_back(host, t);
    return host;
  }
  at::Tensor in_out(const at::Tensor& t) {
    at::Tensor host = in(t);
    outputs_.emplace_back(host, t);
    return host;
  }
  template <typename Stage>
  at::Tensor each(const at::Tensor& t, Stage stage) {
    return (this->*stage)(t);
  }
  template <typename List, typename Stage>
  std::vector<List> each(const std::vector<List>& lists, Stage stage) {
    std::vector<List> host;
    host.reserve(lists.size());
    for (const auto& list : lists) host.push_back(each(list, stage));
    return host;
  }
  bool reads_nothing() const { return inputs_.empty(); }
  void synchronize_targets() const { synchronize_current_streams(targets_of(outputs_)); }
  c10::intrusive_ptr<c10d::Work> work(c10::intrusive_ptr<c10d::Work> host) {
    return c10::make_intrusive<StagedWork>(std::move(host), std::move(inputs_), std::move(outputs_));
  }

 private:
  std::vector<at::Tensor> inputs_;
  std::vector<std::pair<at::Tensor, at::Tensor>> outputs_;
};

// `call(host outputs, host inputs)` on host copies of `inputs`, `outputs` copied back.
// Work queued on the caller's stream before the call (a fill of an output, say) is done
// before the call starts: copying an input waits for it, and a call without inputs (a
// receive) waits for it here.
template <typename Outputs, typename Inputs, typename Call>
c10::intrusive_ptr<c10d::Work> staged(const Outputs& outputs, const Inputs& inputs, Call call) {
  Staging s;
  auto host_in = s.each(inputs, &Staging::in);
  auto host_out = s.each(outputs, &Staging::out);
  if (s.reads_nothing()) s.synchronize_targets();
  return s.work(call(host_out, host_in));
}

// `call(host tensors)` on host copies of `tensors`, which it reads and writes.
template <typename Call>
c10::intrusive_ptr<c10d::Work> staged_in_place(const std::vector<at::Tensor>& tensors, Call call) {
  Staging s;
  auto host = s.each(tensors, &Staging::in_out);
  return s.work(call(host));
}

}  // namespace

HostStagedBackend::HostStagedBackend(c10::intrusive_ptr<c10d::Backend> host)
    : Backend(host ? host->getRank() : 0, host ? host->getSize() : 0), host_(std::move(host)) {
  TORCH_CHECK(host_, "gradzip host staging: needs a host transport");
}

void HostStagedBackend::settle() {
  std::vector<c10::intrusive_ptr<c10d::Work>> earlier;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    earlier.swap(unsettled_);
  }
  for (const auto& work : earlier) {
    try {
      work->wait(kNoTimeout);
    } catch (const std::exception&) {  // its own wait() raises it to whoever waits for it
    }
  }
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::in_order(c10::intrusive_ptr<c10d::Work> work) {
  const std::lock_guard<std::mutex> lock(mutex_);
  unsettled_.push_back(work);
  return work;
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  settle();
  return in_order(staged_in_place(tensors, [&](auto& host) { return host_->broadcast(host, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  settle();
  return in_order(staged_in_place(tensors, [&](auto& host) { return host_->allreduce(host, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::allreduce_sparse(std::vector<at::Tensor>& /*tensors*/,
                                                                   const c10d::AllreduceOptions& /*opts*/) {
  TORCH_CHECK(false, "gradzip host staging: sparse all_reduce of GPU tensors is not supported over the host "
              "transport; densify the tensor, or give the ranks GPUs of their own (NCCL)");
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  settle();
  return in_order(staged_in_place(tensors, [&](auto& host) { return host_->allreduce_coalesced(host, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  settle();
  return in_order(staged_in_place(tensors, [&](auto& host) { return host_->reduce(host, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  settle();
  return in_order(staged(outputs, inputs, [&](auto& out, auto& in) { return host_->allgather(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  settle();
  return in_order(staged(output, input, [&](auto& out, auto& in) { return host_->_allgather_base(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions& opts) {
  settle();
  return in_order(staged(outputs, inputs, [&](auto& out, auto& in) { return host_->allgather_coalesced(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  settle();
  return in_order(staged(outputs, inputs,
                [&](auto& out, auto& in) { return host_->allgather_into_tensor_coalesced(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  settle();
  return in_order(staged(outputs, inputs, [&](auto& out, auto& in) { return host_->gather(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  settle();
  return in_order(staged(outputs, inputs, [&](auto& out, auto& in) { return host_->scatter(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  settle();
  return in_order(staged(outputs, inputs, [&](auto& out, auto& in) { return host_->reduce_scatter(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  settle();
  return in_order(staged(output, input, [&](auto& out, auto& in) { return host_->_reduce_scatter_base(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  settle();
  return in_order(staged(outputs, inputs,
                [&](auto& out, auto& in) { return host_->reduce_scatter_tensor_coalesced(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& output_split_sizes,
                                                                std::vector<int64_t>& input_split_sizes,
                                                                const c10d::AllToAllOptions& opts) {
  settle();
  return in_order(staged(output, input, [&](auto& out, auto& in) {
    return host_->alltoall_base(out, in, output_split_sizes, input_split_sizes, opts);
  }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  settle();
  return in_order(staged(outputs, inputs, [&](auto& out, auto& in) { return host_->alltoall(out, in, opts); }));
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  const std::vector<at::Tensor> none;
  return staged(none, tensors, [&](auto& /*out*/, auto& in) { return host_->send(in, dst_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  const std::vector<at::Tensor> none;
  return staged(tensors, none, [&](auto& out, auto& /*in*/) { return host_->recv(out, src_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const std::vector<at::Tensor> none;
  return staged(tensors, none, [&](auto& out, auto& /*in*/) { return host_->recvAnysource(out, tag); });
}

}  // namespace gradzip
