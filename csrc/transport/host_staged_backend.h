// HostStagedBackend: a c10d::Backend that carries tensors of any device over a host
// transport (Gloo, or gradzip's MPI transport: collectives on CPU tensors), through host
// buffers. It is what carries a gradzip group's CUDA tensors where NCCL cannot: ranks
// that share a GPU (NCCL refuses two ranks on one device), and torch builds or nodes
// without a usable NCCL (python/gradzip/cuda_transport.py chooses).
//
// Every call copies its input tensors into fresh contiguous host tensors (pinned when
// they are on a GPU; the copy waits for the caller's current stream, so it reads what
// was queued before the call), gives those to the host transport's same call, and
// returns a Work that copies the host outputs back into the caller's tensors when the
// host call completes: in wait(), in isCompleted() once it reports true, or in the
// future's callback (getFuture(), where the host transport's Work has a future; Gloo's
// send and recv have none). The copy back is synchronous on the waiting thread's current
// stream, so kernels queued after wait() returns read the result. Each output is copied
// back once, and never after a failed host call. Results are the host transport's, bit
// for bit: it reduces the same values.
//
// Collectives are ordered as on one stream: a collective first waits for the earlier
// ones to complete and be copied back, so that one issued with async_op=True and not yet
// waited for still gives its result to a later collective that reads it (NCCL orders them
// on its stream). Every rank issues a group's collectives in one order, so this cannot
// deadlock. Send and receive are not ordered so (a receive posted before a send on
// both ranks would deadlock): a receive's result is in its tensor once waited for.
//
// Any tensor is staged, CPU tensors included (tests check the staging with them; a
// gradzip group hands this transport only its CUDA tensors). Sparse all-reduce is
// refused. The host transport's rank, size and timeout are this backend's; it stays
// its owner's: shutdown() and abort() here leave it running.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

class HostStagedBackend final : public c10d::Backend {
 public:
  explicit HostStagedBackend(c10::intrusive_ptr<c10d::Backend> host);

  const c10::intrusive_ptr<c10d::Backend>& host() const { return host_; }
  const std::string getBackendName() const override { return "gradzip-host-staged"; }
  void setTimeout(std::chrono::milliseconds timeout) override { host_->setTimeout(timeout); }
  uint64_t getSequenceNumberForGroup() override { return host_->getSequenceNumberForGroup(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override { return host_->barrier(opts); }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    host_->monitoredBarrier(opts, wait_all_ranks);
  }

 private:
  // Waits for the collectives issued before (their errors stay theirs to raise).
  void settle();
  // Records a collective's Work for the next one's settle() and returns it.
  c10::intrusive_ptr<c10d::Work> in_order(c10::intrusive_ptr<c10d::Work> work);

  c10::intrusive_ptr<c10d::Backend> host_;
  std::mutex mutex_;
  std::vector<c10::intrusive_ptr<c10d::Work>> unsettled_;
};

}  // namespace gradzip
