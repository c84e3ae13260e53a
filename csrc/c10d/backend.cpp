#include "c10d/gradzip_backend.h"

#include <stdexcept>

#include <c10/util/Exception.h>

#include "aggregate/compressed_allreduce.h"
#include "aggregate/finite_step.h"
#include "c10d/call_sequence_identity.h"
#include "c10d/checked_p2p.h"
#include "c10d/collective_check.h"
#include "transport/split_sizes.h"

namespace gradzip {

GradzipBackend::GradzipBackend(int rank, int size, c10::intrusive_ptr<c10d::Backend> cpu_transport,
                               c10::intrusive_ptr<c10d::Backend> cuda_transport, const BoundSpec& spec, bool validate,
                               std::chrono::milliseconds timeout)
    : Backend(rank, size),
      cpu_(std::move(cpu_transport)),
      cuda_(std::move(cuda_transport)),
      aggregation_(make_aggregation(spec)),
      options_(c10::make_intrusive<Options>("gradzip", timeout)),
      identity_(std::make_unique<CallSequenceIdentity>()),
      compress_reduce_scatter_(compresses_reduce_scatter(spec)),
      exact_only_(spec.name() == "allreduce") {
  TORCH_CHECK(cpu_, "gradzip: the backend needs a CPU transport");
  TORCH_CHECK(cpu_->getRank() == rank && cpu_->getSize() == size, "gradzip: the CPU transport is rank ",
              cpu_->getRank(), " of ", cpu_->getSize(), ", the backend rank ", rank, " of ", size);
  TORCH_CHECK(!cuda_ || (cuda_->getRank() == rank && cuda_->getSize() == size),
              "gradzip: the CUDA transport's rank and size differ from the backend's");
  if (validate) {
    check_ = std::make_unique<CollectiveCheck>(cpu_, rank, size, timeout);
    receives_ = CheckedReceives::create(timeout);
  }
}

GradzipBackend::~GradzipBackend() {
  if (receives_) receives_->stop("gradzip: the process group was destroyed while this recv waited");
}

c10::intrusive_ptr<Backend> make_backend(int rank, int size, c10::intrusive_ptr<c10d::Backend> cpu_transport,
                                         c10::intrusive_ptr<c10d::Backend> cuda_transport, const BoundSpec& spec,
                                         bool validate, std::chrono::milliseconds timeout) {
  return c10::make_intrusive<GradzipBackend>(rank, size, std::move(cpu_transport), std::move(cuda_transport), spec,
                                             validate, timeout);
}

void GradzipBackend::use_spec(const BoundSpec& spec) {
  drain();
  const auto held = aggregation_->state_dict();
  if (!held.empty()) {
    throw std::invalid_argument("gradzip: the group's aggregation '" + aggregation_->spec().str() +
                                "' cannot become '" + spec.str() + "' after its first compressed all_reduce (it holds " +
                                std::to_string(held.size()) + " state tensors): change it before training starts");
  }
  auto replacement = make_aggregation(spec);
  for (const auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    const NodeLevels& levels = node_levels(device);
    if (levels.node) replacement->use_node_levels(transport(device), levels);
  }
  aggregation_ = std::move(replacement);
  compress_reduce_scatter_ = compresses_reduce_scatter(spec);
  exact_only_ = spec.name() == "allreduce";
}

void GradzipBackend::use_node_levels(c10::DeviceType device, NodeLevels levels) {
  const auto& inner = transport(device);
  TORCH_CHECK(inner, "gradzip: node levels for ", c10::DeviceTypeName(device), " tensors, which this group has no transport for");
  drain();
  aggregation_->use_node_levels(inner, levels);
  (device == c10::DeviceType::CUDA ? cuda_levels_ : cpu_levels_) = std::move(levels);
}

bool GradzipBackend::use_shared_memory_check(const std::string& name) {
  drain();
  return check_ && check_->use_shared_memory(name);
}

std::string GradzipBackend::check_channel() const {
  if (!check_) return "none";
  return check_->through_shared_memory() ? "shared memory" : "transport";
}

void GradzipBackend::setTimeout(std::chrono::milliseconds timeout) {
  options_->timeout = timeout;
  if (check_) check_->set_timeout(timeout);
  if (receives_) receives_->set_timeout(timeout);
  cpu_->setTimeout(timeout);
  if (cuda_) cuda_->setTimeout(timeout);
}

const c10::intrusive_ptr<c10d::Backend>& GradzipBackend::transport_for(const at::Tensor& tensor,
                                                                const char* op) const {
  TORCH_CHECK(!closed_.load(), "gradzip: ", op, " on a process group that was shut down or aborted");
  switch (tensor.device().type()) {
    case c10::DeviceType::CPU:
      return cpu_;
    case c10::DeviceType::CUDA:
      TORCH_CHECK(cuda_, "gradzip: ", op, " got a CUDA tensor, but this process group has no CUDA transport ",
                  "(gradzip or torch was built without CUDA, or no GPU was visible when the group was created)");
      return cuda_;
    default:
      TORCH_CHECK(false, "gradzip: ", op, " got a tensor on device '", tensor.device().str(),
                  "'; gradzip supports cpu and cuda tensors");
  }
}

const c10::intrusive_ptr<c10d::Backend>& GradzipBackend::transport_for(const std::vector<at::Tensor>& tensors,
                                                                const char* op) const {
  TORCH_CHECK(!tensors.empty(), "gradzip: ", op, " got no tensors");
  for (const auto& t : tensors) {
    TORCH_CHECK(t.device().type() == tensors.front().device().type(), "gradzip: ", op,
                " got tensors on different devices (", tensors.front().device().str(), " and ",
                t.device().str(), ")");
  }
  return transport_for(tensors.front(), op);
}

void GradzipBackend::verify(const CollectiveCall& call) {
  worker_.drain();
  check_call(call);
}

void GradzipBackend::check_call(const CollectiveCall& call) {
  if (check_) check_->verify(call);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                  const c10d::BroadcastOptions& opts) {
  const auto& transport = transport_for(tensors, "broadcast");
  auto call = CollectiveCall::of("broadcast", tensors);
  call.root = opts.rootRank;
  verify(call);
  return transport->broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::aggregate(const char* op, std::vector<at::Tensor> tensors,
                                                         const CollectiveCall& call, const at::Tensor& named,
                                                         const at::Tensor& finite_input, const Aggregate& run) {
  std::string key = identity_->key(named);  // in call order
  std::vector<std::string> expired = identity_->take_expired();
  // Expired keys are forgotten in call order, after the last call that used them.
  return worker_.submit(tensors, [this, op, call, finite_input, key = std::move(key), expired = std::move(expired),
                                  run]() {
    std::optional<bool> all_finite;
    if (check_ && finite_input.defined()) {  // one exchange: the check and the finiteness flag
      CollectiveCall with_flag = call;
      with_flag.finite = locally_finite(finite_input) ? 1 : 0;
      all_finite = check_->verify(with_flag);
    } else {
      check_call(call);
    }
    aggregation_->forget(expired);
    try {
      run(key, all_finite)->wait();
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "gradzip: ", op, " of the tensor keyed '", key, "' failed on rank ", getRank(), " of ",
                  getSize(), ": ", e.what_without_backtrace());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "gradzip: ", op, " of the tensor keyed '", key, "' failed on rank ", getRank(), " of ",
                  getSize(), ": ", e.what());
    }
  });
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) {
  const auto& transport = transport_for(tensors, "all_reduce");
  auto call = CollectiveCall::of("all_reduce", tensors);
  call.reduce_op = opts.reduceOp.op_;
  if (exact_only_ && tensors.front().is_cpu() && !opts.asyncOp) {
    // A synchronous exact call keeps no state and has nothing to overlap: it goes to the
    // transport from the caller's thread, as broadcast's does, once checked. Through the
    // worker it would wait for two thread handoffs, which cost as much as a shared-memory
    // check does not (4 ranks on 2 cores: about 1 ms a call). An asynchronous call must
    // not wait for the other ranks in the check: PowerSGD's hook issues them from future
    // callbacks on Gloo's own threads, and a check there held those threads until a
    // rank's next call could not run (a deadlock); it goes through the worker.
    verify(call);
    return aggregation_->allreduce(tensors, opts, transport, stats_, std::string(), std::nullopt);
  }
  const at::Tensor finite_input = aggregation_->finiteness_from_caller(tensors.front()) ? tensors.front() : at::Tensor();
  return aggregate("all_reduce", tensors, call, tensors.front(), finite_input,
                   [this, tensors, opts, transport](const std::string& key, std::optional<bool> all_finite) mutable {
                     return aggregation_->allreduce(tensors, opts, transport, stats_, key, all_finite);
                   });
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                         const c10d::AllreduceOptions& opts) {
  const auto& transport = transport_for(tensors, "all_reduce (sparse)");
  auto call = CollectiveCall::of("all_reduce_sparse", tensors);
  call.numel = -1;  // sparse tensors may hold different numbers of values
  call.reduce_op = opts.reduceOp.op_;
  verify(call);
  return transport->allreduce_sparse(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceCoalescedOptions& opts) {
  const auto& transport = transport_for(tensors, "all_reduce_coalesced");
  auto call = CollectiveCall::of("all_reduce_coalesced", tensors);
  call.reduce_op = opts.reduceOp.op_;
  verify(call);
  return transport->allreduce_coalesced(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::reduce(std::vector<at::Tensor>& tensors,
                                               const c10d::ReduceOptions& opts) {
  const auto& transport = transport_for(tensors, "reduce");
  auto call = CollectiveCall::of("reduce", tensors);
  call.root = opts.rootRank;
  call.reduce_op = opts.reduceOp.op_;
  verify(call);
  return transport->reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs,
                                                  const c10d::AllgatherOptions& opts) {
  const auto& transport = transport_for(inputs, "all_gather");
  verify(CollectiveCall::of("all_gather", inputs));
  return transport->allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                        const c10d::AllgatherOptions& opts) {
  const auto& transport = transport_for(input, "all_gather_into_tensor");
  verify(CollectiveCall::of("all_gather_into_tensor", {input}));
  return transport->_allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  const auto& transport = transport_for(inputs, "all_gather_coalesced");
  verify(CollectiveCall::of("all_gather_coalesced", inputs));
  return transport->allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                        std::vector<at::Tensor>& inputs,
                                                                        const c10d::AllgatherOptions& opts) {
  const auto& transport = transport_for(inputs, "all_gather_into_tensor_coalesced");
  verify(CollectiveCall::of("all_gather_into_tensor_coalesced", inputs));
  return transport->allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                               std::vector<at::Tensor>& inputs,
                                               const c10d::GatherOptions& opts) {
  const auto& transport = transport_for(inputs, "gather");
  auto call = CollectiveCall::of("gather", inputs);
  call.root = opts.rootRank;
  verify(call);
  return transport->gather(outputs, inputs, opts);
}

#if GRADZIP_TORCH_HAS_GATHER_INTO_TENSOR
c10::intrusive_ptr<c10d::Work> GradzipBackend::gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                           const c10d::GatherOptions& opts) {
  const auto& transport = transport_for(input, "gather_single");
  const bool root = getRank() == opts.rootRank;
  const bool usable = !root || (output.is_contiguous() && output.device() == input.device());
  auto call = CollectiveCall::of("gather_single", {input});
  call.root = opts.rootRank;
  // Every rank names the elements the root gathers into (the root: its output's, or
  // kUnusableOutput), so that a root output that cannot take them raises on every rank
  // instead of leaving the others in the transport.
  call.shapes_hash = !root ? getSize() * input.numel() : usable ? output.numel() : CollectiveCall::kUnusableOutput;
  verify(call);
  TORCH_CHECK(usable, "gradzip: gather_single's output must be contiguous and on the input's device (",
              input.device(), ")");
  TORCH_CHECK(!root || output.numel() == getSize() * input.numel(), "gradzip: gather_single's output holds ",
              output.numel(), " elements; the root gathers ", getSize(), " × ", input.numel());
  std::vector<std::vector<at::Tensor>> outputs;
  if (root) {
    const at::Tensor rows = output.view({getSize(), input.numel()});
    outputs.emplace_back();
    for (int r = 0; r < getSize(); ++r) outputs.front().push_back(rows[r].view(input.sizes()));
  }
  std::vector<at::Tensor> inputs{input};
  return transport->gather(outputs, inputs, opts);
}
#endif

c10::intrusive_ptr<c10d::Work> GradzipBackend::scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ScatterOptions& opts) {
  const auto& transport = transport_for(outputs, "scatter");
  auto call = CollectiveCall::of("scatter", outputs);
  call.root = opts.rootRank;
  verify(call);
  return transport->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                       std::vector<std::vector<at::Tensor>>& inputs,
                                                       const c10d::ReduceScatterOptions& opts) {
  const auto& transport = transport_for(outputs, "reduce_scatter");
  auto call = CollectiveCall::of("reduce_scatter", outputs);
  call.reduce_op = opts.reduceOp.op_;
  verify(call);
  return transport->reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::ReduceScatterOptions& opts) {
  const auto& transport = transport_for(output, "reduce_scatter_tensor");
  auto call = CollectiveCall::of("reduce_scatter_tensor", {output});
  call.reduce_op = opts.reduceOp.op_;
  if (!compress_reduce_scatter_) {
    verify(call);
    return transport->_reduce_scatter_base(output, input, opts);
  }
  return aggregate("reduce_scatter_tensor", {output}, call, input, at::Tensor(),
                   [this, output, input, opts, transport](const std::string& key, std::optional<bool>) mutable {
                     return aggregation_->reduce_scatter(output, input, opts, transport, stats_, key);
                   });
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const auto& transport = transport_for(outputs, "reduce_scatter_tensor_coalesced");
  auto call = CollectiveCall::of("reduce_scatter_tensor_coalesced", outputs);
  call.reduce_op = opts.reduceOp.op_;
  verify(call);
  return transport->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                      std::vector<int64_t>& output_split_sizes,
                                                      std::vector<int64_t>& input_split_sizes,
                                                      const c10d::AllToAllOptions& opts) {
  const auto& transport = transport_for(input, "all_to_all_single");
  CollectiveCall call;
  call.op = "all_to_all_single";
  call.dtype = static_cast<int64_t>(input.scalar_type());
  call.send_counts = split_elements(input, input_split_sizes, getSize());
  call.recv_counts = split_elements(output, output_split_sizes, getSize());
  verify(call);
  return transport->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                 std::vector<at::Tensor>& inputs,
                                                 const c10d::AllToAllOptions& opts) {
  const auto& transport = transport_for(inputs, "all_to_all");
  TORCH_CHECK(static_cast<int>(inputs.size()) == getSize() && static_cast<int>(outputs.size()) == getSize(),
              "gradzip: all_to_all needs one input and one output tensor per rank (", getSize(), "), got ",
              inputs.size(), " and ", outputs.size());
  CollectiveCall call;
  call.op = "all_to_all";
  call.dtype = static_cast<int64_t>(inputs.front().scalar_type());
  for (const auto& t : inputs) call.send_counts.push_back(t.numel());
  for (const auto& t : outputs) call.recv_counts.push_back(t.numel());
  verify(call);
  return transport->alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  worker_.drain();
  const auto& transport = transport_for(tensors, "send");
  if (check_ && tensors.size() == 1 && tensors.front().is_cpu()) {
    return checked_send(transport, tensors.front(), dst_rank, tag);
  }
  return transport->send(tensors, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  worker_.drain();
  const auto& transport = transport_for(tensors, "recv");
  if (check_ && tensors.size() == 1 && tensors.front().is_cpu()) {
    return receives_->recv(transport, tensors.front(), src_rank, tag);
  }
  return transport->recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  worker_.drain();
  const auto& transport = transport_for(tensors, "recv");
  if (check_ && tensors.size() == 1 && tensors.front().is_cpu()) {
    return receives_->recv(transport, tensors.front(), -1, tag);
  }
  return transport->recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> GradzipBackend::barrier(const c10d::BarrierOptions& opts) {
  TORCH_CHECK(!closed_.load(), "gradzip: barrier on a process group that was shut down or aborted");
  CollectiveCall call;
  call.op = "barrier";
  verify(call);
  return cpu_->barrier(opts);
}

void GradzipBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  TORCH_CHECK(!closed_.load(), "gradzip: monitored_barrier on a process group that was shut down or aborted");
  worker_.drain();
  cpu_->monitoredBarrier(opts, wait_all_ranks);
}

uint64_t GradzipBackend::getSequenceNumberForGroup() {
  return cpu_->getSequenceNumberForGroup();
}

void GradzipBackend::shutdown() {
  if (closed_.exchange(true)) return;
  worker_.drain();
  if (check_) check_->stop();
  if (receives_) receives_->stop("gradzip: the process group was shut down while this recv waited");
  cpu_->shutdown();
  if (cuda_) cuda_->shutdown();
  if (receives_) receives_->join(options_->timeout);
}

void GradzipBackend::abort() {
  if (closed_.exchange(true)) return;
  worker_.abort("gradzip: the process group was aborted (abort() was called) while this all_reduce ran or waited");
  if (check_) check_->stop();
  if (receives_) receives_->stop("gradzip: the process group was aborted (abort() was called) while this recv waited");
  cpu_->abort();
  if (cuda_) cuda_->abort();
  if (receives_) receives_->join(options_->timeout);
}

}  // namespace gradzip
