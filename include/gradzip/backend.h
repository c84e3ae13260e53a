// gradzip::Backend: the torch.distributed backend "gradzip".
//
// all_reduce runs the configured Aggregation (gradzip/aggregation.h); every other
// collective is forwarded unchanged to a real transport: the CPU transport (Gloo) for
// CPU tensors, the CUDA transport (NCCL) for CUDA tensors. With `validate` on, every
// rank first confirms that all ranks made the same call with compatible tensors, so a
// mismatch is an error on every rank instead of an aborted process or a hang.
//
// Tensors of any other device, or CUDA tensors when there is no CUDA transport, are
// refused with an error naming the device. shutdown() and abort() may be called any
// number of times; collectives after them are refused.
#pragma once

#include <chrono>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "gradzip/aggregation.h"

namespace gradzip {

class Backend : public c10d::Backend {
 public:
  using c10d::Backend::Backend;

  virtual Aggregation& aggregation() = 0;
  virtual const Aggregation& aggregation() const = 0;
  // Replaces the aggregation with one made from `spec`, once every all_reduce issued
  // before has finished, before the aggregation holds state (its state_dict() empty;
  // else std::invalid_argument): a script that learns its optimizer after the group is
  // made (gradzip.fold_momentum). The node levels given before carry over. Every rank
  // must give the same spec; the caller checks that.
  virtual void use_spec(const BoundSpec& spec) = 0;
  // The transport for a device type (CPU or CUDA); null when there is none.
  virtual const c10::intrusive_ptr<c10d::Backend>& transport(c10::DeviceType device) const = 0;
  virtual bool validates() const = 0;
  virtual bool has_cuda_transport() const = 0;
  // The bytes all_reduce moved, and what dense fp32 would have moved.
  virtual Stats& stats() = 0;
  // Returns once every all_reduce issued before has finished (on its worker thread: at once).
  virtual void drain() = 0;
  // How the ranks of `device`'s transport sit in nodes (gradzip/aggregation.h), handed to
  // the aggregation for its calls over that transport; node_levels() gives them back
  // (null transports when none were given).
  virtual void use_node_levels(c10::DeviceType device, NodeLevels levels) = 0;
  virtual const NodeLevels& node_levels(c10::DeviceType device) const = 0;
  // Collective: the collective check's fingerprints travel through the POSIX
  // shared-memory object `name` (the same on every rank) when every rank of the group can
  // map it, as on one host (c10d/shared_check_board.h). Returns whether they do; false,
  // and nothing changes, for a group that does not check its calls.
  virtual bool use_shared_memory_check(const std::string& name) = 0;
  // How the check's fingerprints travel: "shared memory", "transport", or "none" (a group
  // that does not check its calls).
  virtual std::string check_channel() const = 0;
  // The aggregation's state_dict() / load_state_dict() once every all_reduce issued
  // before has finished (all_reduce runs on a worker thread: gradzip_backend.h).
  std::map<std::string, at::Tensor> state_dict() {
    drain();
    return aggregation().state_dict();
  }
  void load_state_dict(const std::map<std::string, at::Tensor>& state) {
    drain();
    aggregation().load_state_dict(state);
  }
};

// A gradzip backend over a CPU transport and an optional CUDA transport (null: none),
// both of `size` ranks with this one at `rank`.
c10::intrusive_ptr<Backend> make_backend(int rank, int size, c10::intrusive_ptr<c10d::Backend> cpu_transport,
                                         c10::intrusive_ptr<c10d::Backend> cuda_transport, const BoundSpec& spec,
                                         bool validate, std::chrono::milliseconds timeout);

}  // namespace gradzip
