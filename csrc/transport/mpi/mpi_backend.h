// MpiBackend: a c10d::Backend for CPU tensors over one MPI communicator (Open MPI or
// MPICH), the transport a gradzip process group uses under mpirun instead of Gloo.
//
// The communicator holds the group's ranks in their c10d order (MPI_Comm_dup of the
// world, or MPI_Comm_create_group of `global_ranks`; collective over those ranks only).
// Collectives run on one worker thread per communicator in call order (every rank
// issues them in the same order, as MPI requires) and return at once; the Work's future
// completes on that thread. Point-to-point calls are posted at once, in call order (MPI
// matches messages in posting order), and a second thread completes them. Both threads
// poll MPI at the pace of mpi::Backoff: at full pace for as long as the call's bytes
// could take, then sleeping between polls, so a rank that waits for a late peer does not
// hold a core. Both complete futures under a pass of the exit gate (work/exit_gate.h).
//
// Results are bitwise identical on every rank and do not depend on the MPI library's
// algorithms: MPI only moves bytes; every reduction is computed by torch, each element
// combined over ranks in rank order (r0 op r1 op ...), on the rank that owns its chunk,
// and then sent to the others. With two ranks that is Gloo's result bit for bit; with
// more, a sum may round differently from Gloo's ring (same values, another order).
// AVG (floating-point tensors) is the sum divided by the group size, as in Gloo.
//
// Every call waits at most the group's timeout (or the call's own): a rank that has
// stopped, died or called another collective gives an error naming the call, and the
// communicator refuses every later call (its requests stay posted; MPI cannot cancel
// a collective). Tensors must be CPU, dense; non-contiguous ones are staged. A message
// holds at most 2^31 − 1 elements (MPI's int counts).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "work/ordered_worker.h"
#include "transport/mpi/mpi_runtime.h"

namespace gradzip {

class MpiBackend final : public c10d::Backend {
 public:
  // Starts MPI if needed. `global_ranks`: the group's world ranks in group order; empty
  // means the whole world. Raises when this process is not rank `rank` of them, or the
  // world's size or rank disagree with MPI's.
  MpiBackend(int rank, int size, const std::vector<int64_t>& global_ranks, std::chrono::milliseconds timeout);
  ~MpiBackend() override;

  // Releases every live communicator and finalizes MPI: once, at interpreter exit.
  static void finish_all();

  const std::string getBackendName() const override { return "gradzip-mpi"; }
  // MPI_TAG_UB: point-to-point tags run 0 .. largest_tag() (Open MPI 2^31 - 1, MPICH 2^28 - 1).
  int largest_tag() const { return largest_tag_; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
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

  void shutdown() override;
  void abort() override;

 private:
  struct PendingPointToPoint;
  using Post = std::function<int(MPI_Request*)>;  // posts one request; returns MPI's code

  // Queues `body` on the worker; the Work's future holds `tensors` once it has run.
  c10::intrusive_ptr<c10d::Work> collective(const char* op, std::vector<at::Tensor> tensors,
                                            std::chrono::milliseconds timeout, std::function<void()> body);
  // Posts a request with `post` (named `call`, under MPI's lock) and waits for it until
  // the running collective's deadline; a timeout breaks the communicator.
  void exchange(const char* op, const char* call, const Post& post);
  // Reduces this rank's chunk of `flat` (1-D, contiguous) over every rank's `flat`, in
  // place; returns each rank's chunk as counts and offsets in elements.
  std::pair<std::vector<int>, std::vector<int>> reduce_own_chunk(const char* op, const at::Tensor& flat,
                                                                 c10d::ReduceOp reduce);
  // `flat` (1-D, contiguous) := the rank-ordered reduction of every rank's `flat`.
  void allreduce_flat(const char* op, const at::Tensor& flat, c10d::ReduceOp reduce);
  // `receive` (contiguous, m elements) := the rank-ordered reduction of block `rank` of
  // every rank's `send` (contiguous, P blocks of m).
  void reduce_scatter_flat(const char* op, const at::Tensor& send, const at::Tensor& receive,
                           c10d::ReduceOp reduce);
  // `receive` (contiguous) := every rank's `send` (contiguous, the same size), in rank order.
  void allgather_flat(const char* op, const at::Tensor& send, const at::Tensor& receive);
  // `out` := the rank-ordered reduction of `pieces`' rows (pieces[r] came from rank r).
  void reduce_rows(const at::Tensor& pieces, const at::Tensor& out, c10d::ReduceOp reduce) const;
  // `numel` elements of scratch memory, kept from call to call (fresh pages cost a fault
  // each); the worker thread's only, valid until its next call.
  at::Tensor scratch(int64_t numel, const at::TensorOptions& options);
  c10::intrusive_ptr<c10d::Work> point_to_point(const char* op, at::Tensor tensor, int peer, int tag, bool receive);
  void complete_point_to_point();
  // Bytes of the posted point-to-point calls (pending_mutex_ held).
  int64_t pending_bytes() const;
  void check_usable(const char* op) const;
  void break_with(const std::string& reason);
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds requested) const;
  // Stops the threads (queued collectives run first) and frees the communicator, unless a
  // timed-out call left requests posted on it.
  void release();

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::chrono::milliseconds timeout_;
  int largest_tag_ = 0;  // MPI_TAG_UB, read by the constructor
  mpi::Clock::time_point deadline_;  // of the collective the worker runs
  int64_t call_bytes_ = 0;            // what it moves, about
  at::Tensor scratch_;                // bytes, see scratch()
  mutable std::mutex broken_mutex_;
  std::string broken_;  // why the communicator is unusable; empty while it is usable
  std::atomic<bool> closed_{false};

  std::mutex pending_mutex_;
  std::condition_variable pending_wake_;
  std::list<std::shared_ptr<PendingPointToPoint>> pending_;  // posted point-to-point calls
  uint64_t posted_ = 0;                                       // how many were ever posted
  bool stopping_ = false;
  std::thread completer_;
  std::unique_ptr<OrderedWorker> worker_;  // last: its jobs use the members above
};

}  // namespace gradzip
