// MpiBackend's c10d collectives: each checks its arguments on the calling thread, then
// queues its body (collective()), which stages the tensors contiguous, runs the flat
// collective or MPI request it needs, and copies results back into the caller's tensors.
#include "transport/mpi/mpi_backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "transport/split_sizes.h"
#include "transport/mpi/mpi_argument_checks.h"
#include "transport/mpi/mpi_buffers.h"

namespace gradzip {

c10::intrusive_ptr<c10d::Work> MpiBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast");
  check_rank(static_cast<int>(opts.rootRank), getSize(), "broadcast", "root");
  count_of(tensors[0].numel(), "broadcast");
  const at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return collective("broadcast", tensors, opts.timeout, [this, t, root] {
    const at::Tensor flat = staged(t);
    exchange("broadcast", "MPI_Ibcast", [&](MPI_Request* request) {
      return MPI_Ibcast(flat.data_ptr(), static_cast<int>(flat.numel()), type_of(flat), root, comm_, request);
    });
    unstage(flat, t);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  check_one(tensors, "all_reduce");
  check_reduce(opts.reduceOp, tensors[0].scalar_type(), "all_reduce");
  const at::Tensor t = tensors[0];
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("all_reduce", tensors, opts.timeout, [this, t, reduce] {
    const at::Tensor flat = staged(t);
    allreduce_flat("all_reduce", flat.view({-1}), reduce);
    unstage(flat, t);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "gradzip mpi: all_reduce_coalesced got no tensors");
  for (const auto& t : tensors) {
    check_tensor(t, "all_reduce_coalesced");
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                "gradzip mpi: all_reduce_coalesced takes tensors of one dtype, got ", tensors[0].scalar_type(),
                " and ", t.scalar_type());
  }
  check_reduce(opts.reduceOp, tensors[0].scalar_type(), "all_reduce_coalesced");
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("all_reduce_coalesced", tensors, opts.timeout, [this, tensors, reduce] {
    const at::Tensor flat = flat_cat(tensors);
    allreduce_flat("all_reduce_coalesced", flat, reduce);
    flat_split(flat, tensors);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce");
  check_rank(static_cast<int>(opts.rootRank), getSize(), "reduce", "root");
  check_reduce(opts.reduceOp, tensors[0].scalar_type(), "reduce");
  const at::Tensor t = tensors[0];
  const c10d::ReduceOp reduce = opts.reduceOp;
  const int root = static_cast<int>(opts.rootRank);
  return collective("reduce", tensors, opts.timeout, [this, t, reduce, root] {
    const at::Tensor flat = t.reshape({-1}).clone();  // only the root's tensor changes
    auto [counts, offsets] = reduce_own_chunk("reduce", flat, reduce);
    const MPI_Datatype type = type_of(flat);
    const bool is_root = getRank() == root;
    const void* mine = static_cast<const char*>(flat.data_ptr()) + int64_t{offsets[getRank()]} * flat.element_size();
    exchange("reduce", "MPI_Igatherv", [&](MPI_Request* request) {
      return MPI_Igatherv(is_root ? MPI_IN_PLACE : mine, counts[getRank()], type, flat.data_ptr(), counts.data(),
                          offsets.data(), type, root, comm_, request);
    });
    if (is_root) t.copy_(flat.view(t.sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  check_tensor(input, "all_gather_into_tensor");
  check_same(output, input, input.numel() * getSize(), "all_gather_into_tensor", "output");
  count_of(output.numel(), "all_gather_into_tensor");
  const at::Tensor in = input, out = output;
  return collective("all_gather_into_tensor", {output}, opts.timeout, [this, in, out] {
    const at::Tensor send = staged(in), receive = staged(out);
    allgather_flat("all_gather_into_tensor", send, receive);
    unstage(receive, out);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  check_one(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
              "gradzip mpi: all_gather needs one output list of ", getSize(), " tensors");
  for (const auto& o : outputs[0]) check_same(o, inputs[0], inputs[0].numel(), "all_gather", "output");
  count_of(inputs[0].numel() * getSize(), "all_gather");
  const at::Tensor in = inputs[0];
  const std::vector<at::Tensor> outs = outputs[0];
  return collective("all_gather", outs, opts.timeout, [this, in, outs] {
    const at::Tensor send = staged(in);
    const at::Tensor receive = at::empty({send.numel() * getSize()}, send.options());
    allgather_flat("all_gather", send, receive);
    flat_split(receive, outs);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == static_cast<size_t>(getSize()),
              "gradzip mpi: all_gather_coalesced needs one output list per rank (", getSize(), "), got ",
              outputs.size());
  for (const auto& per_rank : outputs) {
    TORCH_CHECK(per_rank.size() == inputs.size(), "gradzip mpi: all_gather_coalesced needs ", inputs.size(),
                " outputs per rank, got ", per_rank.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_tensor(inputs[i], "all_gather_coalesced");
      check_same(per_rank[i], inputs[i], inputs[i].numel(), "all_gather_coalesced", "output");
    }
  }
  const std::vector<at::Tensor> ins = inputs;
  const std::vector<std::vector<at::Tensor>> outs = outputs;
  std::vector<at::Tensor> all_outputs;
  for (const auto& per_rank : outputs) all_outputs.insert(all_outputs.end(), per_rank.begin(), per_rank.end());
  return collective("all_gather_coalesced", all_outputs, opts.timeout, [this, ins, outs] {
    // One all-gather of every input, flattened: rank r's block holds its inputs in order.
    const at::Tensor send = flat_cat(ins);
    const int n = count_of(send.numel() * getSize(), "all_gather_coalesced") / getSize();
    const at::Tensor receive = at::empty({send.numel() * getSize()}, send.options());
    allgather_flat("all_gather_coalesced", send, receive);
    for (int r = 0; r < getSize(); ++r) flat_split(receive.narrow(0, int64_t{r} * n, n), outs[r]);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "gradzip mpi: all_gather_into_tensor_coalesced got ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "all_gather_into_tensor_coalesced");
    check_same(outputs[i], inputs[i], inputs[i].numel() * getSize(), "all_gather_into_tensor_coalesced", "output");
    count_of(outputs[i].numel(), "all_gather_into_tensor_coalesced");
  }
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  return collective("all_gather_into_tensor_coalesced", outputs, opts.timeout, [this, ins, outs] {
    for (size_t i = 0; i < ins.size(); ++i) {
      const at::Tensor send = staged(ins[i]), receive = staged(outs[i]);
      allgather_flat("all_gather_into_tensor_coalesced", send, receive);
      unstage(receive, outs[i]);
    }
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  check_one(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  check_rank(root, getSize(), "gather", "root");
  const bool is_root = getRank() == root;
  const std::vector<at::Tensor> outs = root_list(outputs, is_root, getSize(), inputs[0], "gather", "output");
  count_of(inputs[0].numel() * getSize(), "gather");
  const at::Tensor in = inputs[0];
  return collective("gather", outs, opts.timeout, [this, in, outs, root, is_root] {
    const at::Tensor send = staged(in);
    const at::Tensor receive = is_root ? at::empty({send.numel() * getSize()}, send.options()) : at::Tensor();
    exchange("gather", "MPI_Igather", [&](MPI_Request* request) {
      const int n = static_cast<int>(send.numel());
      return MPI_Igather(send.data_ptr(), n, type_of(send), is_root ? receive.data_ptr() : nullptr, n,
                         type_of(send), root, comm_, request);
    });
    if (is_root) flat_split(receive, outs);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  check_rank(root, getSize(), "scatter", "root");
  const bool is_root = getRank() == root;
  const std::vector<at::Tensor> ins = root_list(inputs, is_root, getSize(), outputs[0], "scatter", "input");
  count_of(outputs[0].numel() * getSize(), "scatter");
  const at::Tensor out = outputs[0];
  return collective("scatter", outputs, opts.timeout, [this, out, ins, root, is_root] {
    const at::Tensor send = is_root ? flat_cat(ins) : at::Tensor();
    const at::Tensor receive = staged(out);
    exchange("scatter", "MPI_Iscatter", [&](MPI_Request* request) {
      const int n = static_cast<int>(receive.numel());
      return MPI_Iscatter(is_root ? send.data_ptr() : nullptr, n, type_of(receive), receive.data_ptr(), n,
                          type_of(receive), root, comm_, request);
    });
    unstage(receive, out);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  check_tensor(output, "reduce_scatter_tensor");
  check_same(input, output, output.numel() * getSize(), "reduce_scatter_tensor", "input");
  check_reduce(opts.reduceOp, output.scalar_type(), "reduce_scatter_tensor");
  count_of(input.numel(), "reduce_scatter_tensor");
  const at::Tensor in = input, out = output;
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("reduce_scatter_tensor", {output}, opts.timeout, [this, in, out, reduce] {
    const at::Tensor send = staged(in), receive = staged(out);
    reduce_scatter_flat("reduce_scatter_tensor", send, receive, reduce);
    unstage(receive, out);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "gradzip mpi: reduce_scatter needs one input list of ", getSize(), " tensors");
  for (const auto& i : inputs[0]) check_same(i, outputs[0], outputs[0].numel(), "reduce_scatter", "input");
  check_reduce(opts.reduceOp, outputs[0].scalar_type(), "reduce_scatter");
  count_of(outputs[0].numel() * getSize(), "reduce_scatter");
  const at::Tensor out = outputs[0];
  const std::vector<at::Tensor> ins = inputs[0];
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("reduce_scatter", outputs, opts.timeout, [this, out, ins, reduce] {
    const at::Tensor send = flat_cat(ins), receive = staged(out);
    reduce_scatter_flat("reduce_scatter", send, receive, reduce);
    unstage(receive, out);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "gradzip mpi: reduce_scatter_tensor_coalesced got ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(outputs[i], "reduce_scatter_tensor_coalesced");
    check_same(inputs[i], outputs[i], outputs[i].numel() * getSize(), "reduce_scatter_tensor_coalesced", "input");
    check_reduce(opts.reduceOp, outputs[i].scalar_type(), "reduce_scatter_tensor_coalesced");
    count_of(inputs[i].numel(), "reduce_scatter_tensor_coalesced");
  }
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("reduce_scatter_tensor_coalesced", outputs, opts.timeout, [this, ins, outs, reduce] {
    for (size_t i = 0; i < ins.size(); ++i) {
      const at::Tensor send = staged(ins[i]), receive = staged(outs[i]);
      reduce_scatter_flat("reduce_scatter_tensor_coalesced", send, receive, reduce);
      unstage(receive, outs[i]);
    }
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_split_sizes,
                                                         std::vector<int64_t>& input_split_sizes,
                                                         const c10d::AllToAllOptions& opts) {
  check_tensor(input, "all_to_all_single");
  check_same(output, input, output.numel(), "all_to_all_single", "output");
  const std::vector<int> send_counts =
      int_counts(split_elements(input, input_split_sizes, getSize()), "all_to_all_single");
  const std::vector<int> receive_counts =
      int_counts(split_elements(output, output_split_sizes, getSize()), "all_to_all_single");
  const std::vector<int> send_offsets = offsets_of(send_counts, "all_to_all_single");
  const std::vector<int> receive_offsets = offsets_of(receive_counts, "all_to_all_single");
  const at::Tensor in = input, out = output;
  return collective("all_to_all_single", {output}, opts.timeout,
                    [this, in, out, send_counts, receive_counts, send_offsets, receive_offsets] {
                      const at::Tensor send = staged(in), receive = staged(out);
                      exchange("all_to_all_single", "MPI_Ialltoallv", [&](MPI_Request* request) {
                        return MPI_Ialltoallv(send.data_ptr(), send_counts.data(), send_offsets.data(),
                                              type_of(send), receive.data_ptr(), receive_counts.data(),
                                              receive_offsets.data(), type_of(send), comm_, request);
                      });
                      unstage(receive, out);
                    });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == getSize() && static_cast<int>(outputs.size()) == getSize(),
              "gradzip mpi: all_to_all needs ", getSize(), " inputs and outputs, got ", inputs.size(), " and ",
              outputs.size());
  std::vector<int64_t> send_counts, receive_counts;
  for (int r = 0; r < getSize(); ++r) {
    check_tensor(inputs[r], "all_to_all");
    check_same(outputs[r], inputs[0], outputs[r].numel(), "all_to_all", "output");
    check_same(inputs[r], inputs[0], inputs[r].numel(), "all_to_all", "input");
    send_counts.push_back(inputs[r].numel());
    receive_counts.push_back(outputs[r].numel());
  }
  const std::vector<int> sends = int_counts(send_counts, "all_to_all");
  const std::vector<int> receives = int_counts(receive_counts, "all_to_all");
  const std::vector<int> send_offsets = offsets_of(sends, "all_to_all");
  const std::vector<int> receive_offsets = offsets_of(receives, "all_to_all");
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  return collective("all_to_all", outputs, opts.timeout,
                    [this, ins, outs, sends, receives, send_offsets, receive_offsets] {
                      const at::Tensor send = flat_cat(ins);
                      int64_t total = 0;
                      for (int c : receives) total += c;
                      const at::Tensor receive = at::empty({total}, send.options());
                      exchange("all_to_all", "MPI_Ialltoallv", [&](MPI_Request* request) {
                        return MPI_Ialltoallv(send.data_ptr(), sends.data(), send_offsets.data(), type_of(send),
                                              receive.data_ptr(), receives.data(), receive_offsets.data(),
                                              type_of(send), comm_, request);
                      });
                      flat_split(receive, outs);
                    });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::barrier(const c10d::BarrierOptions& opts) {
  return collective("barrier", {}, opts.timeout, [this] {
    exchange("barrier", "MPI_Ibarrier", [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
  });
}

}  // namespace gradzip
