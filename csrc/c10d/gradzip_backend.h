// GradzipBackend: the implementation of gradzip::Backend (gradzip/backend.h).
//
// all_reduce runs the configured Aggregation (and so does reduce_scatter_tensor, when
// the spec says reduce_scatter=compressed) on the group's worker thread
// (work/ordered_worker.h), so that the call returns at once and DDP goes on with its
// backward pass; CUDA tensors there on a side stream ordered after the caller's. Every
// other call first waits for the queued all-reduces, so no transport call overtakes
// one. Every other collective is forwarded
// unchanged to a real transport: the CPU transport (Gloo) for CPU tensors, the CUDA
// transport (NCCL) for CUDA tensors. Before a collective is forwarded, and when
// `validate` is on, every rank confirms that all ranks made the same call with
// compatible tensors (csrc/c10d/collective_check.h), so a size mismatch is an error on
// every rank instead of an aborted process or a hang. With `validate` on, CPU send/recv
// carry a small header, so a recv that disagrees with its send raises on the receiver
// (csrc/c10d/checked_p2p.h).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "work/ordered_worker.h"
#include "work/torch_version.h"
#include "gradzip/backend.h"

namespace gradzip {

class CallSequenceIdentity;
class CheckedReceives;
class CollectiveCheck;
struct CollectiveCall;

class GradzipBackend final : public Backend {
 public:
  // `cuda_transport` may be null (no GPU, or a CPU-only build).
  GradzipBackend(int rank, int size, c10::intrusive_ptr<c10d::Backend> cpu_transport,
                 c10::intrusive_ptr<c10d::Backend> cuda_transport, const BoundSpec& spec, bool validate,
                 std::chrono::milliseconds timeout);
  ~GradzipBackend() override;

  Aggregation& aggregation() override { return *aggregation_; }
  const Aggregation& aggregation() const override { return *aggregation_; }
  void use_spec(const BoundSpec& spec) override;
  const c10::intrusive_ptr<c10d::Backend>& transport(c10::DeviceType device) const override {
    return device == c10::DeviceType::CUDA ? cuda_ : cpu_;
  }
  bool validates() const override { return check_ != nullptr; }
  bool has_cuda_transport() const override { return cuda_ != nullptr; }
  Stats& stats() override { return stats_; }
  void drain() override { worker_.drain(); }
  void use_node_levels(c10::DeviceType device, NodeLevels levels) override;
  bool use_shared_memory_check(const std::string& name) override;
  std::string check_channel() const override;
  const NodeLevels& node_levels(c10::DeviceType device) const override {
    return device == c10::DeviceType::CUDA ? cuda_levels_ : cpu_levels_;
  }

  const std::string getBackendName() const override { return "gradzip"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  void setTimeout(std::chrono::milliseconds timeout) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
#if GRADZIP_TORCH_HAS_GATHER_INTO_TENSOR
  // dist.gather_single (torch 2.14; Gloo has none): the transport's list gather into rows
  // of the root's output, which must hold the group's size × the input's elements.
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  uint64_t getSequenceNumberForGroup() override;

  // Idempotent. shutdown() lets queued all-reduces finish, abort() fails them; both fail
  // the receives not yet complete, shut the transports down, and return once the
  // receive threads have ended (at most the group's timeout): a thread let go of an
  // application's tensor after the interpreter began to exit would abort the process.
  void shutdown() override;
  void abort() override;

 private:
  // The transport for these tensors' device; refuses an empty list, mixed devices,
  // devices other than CPU and CUDA, and CUDA without a CUDA transport.
  const c10::intrusive_ptr<c10d::Backend>& transport_for(const std::vector<at::Tensor>& tensors,
                                                         const char* op) const;
  const c10::intrusive_ptr<c10d::Backend>& transport_for(const at::Tensor& tensor, const char* op) const;
  // Waits for queued all-reduces, then checks the call across ranks (when validating).
  void verify(const CollectiveCall& call);
  void check_call(const CollectiveCall& call);
  // Runs `run` (an aggregation's call) under the key the call sequence gives `named`:
  // on the worker, in call order (CUDA tensors on its side stream), with errors naming
  // `op`, the key and this rank. The Work's future holds `tensors`. With a defined
  // `finite_input` (an input the aggregation takes finiteness_from_caller() for), the check carries
  // whether it is finite and `run` gets every rank's answer; otherwise nullopt.
  using Aggregate =
      std::function<c10::intrusive_ptr<c10d::Work>(const std::string& key, std::optional<bool> all_finite)>;
  c10::intrusive_ptr<c10d::Work> aggregate(const char* op, std::vector<at::Tensor> tensors,
                                           const CollectiveCall& call, const at::Tensor& named,
                                           const at::Tensor& finite_input, const Aggregate& run);

  c10::intrusive_ptr<c10d::Backend> cpu_;
  c10::intrusive_ptr<c10d::Backend> cuda_;
  NodeLevels cpu_levels_;
  NodeLevels cuda_levels_;
  std::unique_ptr<Aggregation> aggregation_;
  std::unique_ptr<CollectiveCheck> check_;
  std::shared_ptr<CheckedReceives> receives_;  // with check_
  c10::intrusive_ptr<Options> options_;
  Stats stats_;
  std::unique_ptr<CallSequenceIdentity> identity_;  // names the tensors all_reduce gets
  bool compress_reduce_scatter_;                    // the spec's reduce_scatter=compressed
  bool exact_only_;                                 // the spec is `allreduce`: no state, nothing compressed
  std::atomic<bool> closed_{false};
  OrderedWorker worker_;  // last: its jobs use the members above until it is gone
};

}  // namespace gradzip
