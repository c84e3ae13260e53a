// CollectiveCheck: before a collective reaches the transport, every rank confirms
// that all ranks entered the same collective with compatible tensors.
//
// Why: Gloo aborts the whole process when ranks pass tensors of different sizes,
// and NCCL hangs or reads out of bounds. The check is one small all-to-all of a
// fixed-size fingerprint on the CPU transport (one message latency), or, for a group on
// one host, an exchange through shared memory (shared_check_board.h: tens of
// microseconds); every rank sees every fingerprint, so every rank raises the same error,
// naming each rank's call, and none hangs.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradzip {

class SharedCheckBoard;

// What one rank is about to do. Fields that do not apply to a collective stay -1.
struct CollectiveCall {
  std::string op;            // the torch.distributed name, e.g. "all_reduce"
  int64_t dtype = -1;        // c10::ScalarType of the tensors
  int64_t numel = -1;        // the element count that must agree across ranks
  int64_t count = -1;        // number of tensors (coalesced collectives)
  int64_t shapes_hash = -1;  // hash of every tensor's numel (lists of several tensors);
                             // gather_single: the gathered elements (the root's output,
                             // or kUnusableOutput)
  int64_t root = -1;
  int64_t reduce_op = -1;
  // 1 or 0: whether this rank's input is finite, for an aggregation that must agree on it
  // (Aggregation::finiteness_from_caller); it travels with the fingerprint, so that agreeing
  // costs no exchange of its own. Not compared: ranks may differ.
  int64_t finite = -1;
  // alltoall only: elements this rank sends to / receives from each rank.
  std::vector<int64_t> send_counts, recv_counts;

  // gather_single's shapes_hash at a root whose output is not contiguous or not on the
  // input's device.
  static constexpr int64_t kUnusableOutput = -2;
  // Describes a list of tensors: dtype of the first, total numel, count, hash of numels.
  static CollectiveCall of(std::string op, const std::vector<at::Tensor>& tensors);
};

class CollectiveCheck {
 public:
  CollectiveCheck(c10::intrusive_ptr<c10d::Backend> channel, int rank, int size, std::chrono::milliseconds timeout);
  ~CollectiveCheck();

  // Collective: fingerprints travel through the shared-memory object `name` from now on
  // when every rank can map it (SharedCheckBoard::open); returns whether they do.
  bool use_shared_memory(const std::string& name);
  bool through_shared_memory() const { return board_ != nullptr; }
  // Ends a check waiting on the others, and through shared memory tells them that this
  // rank will check no more (the group's abort() and shutdown()).
  void stop();
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  // Returns when every rank made a compatible call; otherwise throws c10::Error
  // with the same message on every rank. Returns false when a rank reported a `finite`
  // of 0 (the same answer on every rank).
  bool verify(const CollectiveCall& mine);

 private:
  // Every rank's fingerprint (width int64 each, in rank order).
  std::vector<int64_t> exchange(const std::vector<int64_t>& mine, const std::string& op);

  c10::intrusive_ptr<c10d::Backend> channel_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<SharedCheckBoard> board_;
};

}  // namespace gradzip
