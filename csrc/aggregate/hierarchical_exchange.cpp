// Hierarchical: exact inside each node, compressed across the nodes (aggregate/exchange.h).
// Rows inside the node are fp32 and one element longer than the longest chunk: the last
// element of a rank's all-gathered row says whether its exchange across the nodes
// failed, so that every rank of the node raises when one lane fails instead of waiting.
#include <c10/util/Exception.h>

#include "aggregate/exchange_rounds.h"

namespace gradzip {
namespace {

class HierarchicalExchange final : public Exchange {
 public:
  HierarchicalExchange(NodeLevels levels, const Exchange& across) : levels_(std::move(levels)), across_(across) {
    TORCH_CHECK(levels_.node && levels_.lane, "gradzip: the hierarchical exchange needs a node and a lane transport");
  }
  ExchangeScheme scheme() const override { return ExchangeScheme::kHierarchical; }
  Chunk owned(int64_t n, int, int) const override {
    const Chunk shard = exchange_chunk(n, levels_.node->getSize(), levels_.node->getRank());
    const Chunk inner = across_.owned(shard.length, levels_.lane->getSize(), levels_.lane->getRank());
    return {shard.begin + inner.begin, inner.length};
  }
  int64_t allreduce(const TensorCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                      const c10::intrusive_ptr<c10d::Backend>& transport) const override {
    const int local_ranks = levels_.node->getSize();
    const int local = levels_.node->getRank();
    TORCH_CHECK(local_ranks * levels_.lane->getSize() == transport->getSize(), "gradzip: ", levels_.lane->getSize(),
                " nodes of ", local_ranks, " ranks do not make the group's ", transport->getSize());
    const int64_t n = call.x.numel();
    const Chunk shard = exchange_chunk(n, local_ranks, local);
    const int64_t width = largest_chunk(n, local_ranks) + 1;  // a chunk, then the status
    const int64_t row_bytes = 4 * width;
    const at::Device device = call.x.device();
    Rounds flights(call);

    // Inside the node, exact: local rank j gets the node's rows of chunk j (x plus the
    // worker residual, which is then zero outside this rank's shard), summed in local
    // rank order.
    const at::Tensor rows = bytes_on(device, local_ranks * row_bytes, Buffer::kNodeSend).view(at::kFloat);
    for (int j = 0; j < local_ranks; ++j) {
      const Chunk c = exchange_chunk(n, local_ranks, j);
      at::Tensor row = rows.narrow(0, j * width, c.length);
      if (call.worker_residual.defined()) {
        at::add_out(row, call.x.narrow(0, c.begin, c.length), call.worker_residual.narrow(0, c.begin, c.length));
      } else {
        row.copy_(call.x.narrow(0, c.begin, c.length));
      }
    }
    if (call.worker_residual.defined()) call.worker_residual.zero_();
    flights.start_alltoall(rows.view(at::kByte),
                           bytes_on(call.transport_device, local_ranks * row_bytes, Buffer::kNodeReceived),
                           levels_.node);
    const at::Tensor received = flights.finish(0).view(at::kFloat);
    const at::Tensor shard_x = bytes_on(device, 4 * shard.length, Buffer::kShard).view(at::kFloat);
    shard_x.copy_(received.narrow(0, 0, shard.length));
    for (int j = 1; j < local_ranks; ++j) shard_x.add_(received.narrow(0, j * width, shard.length));

    // Across the nodes, compressed: the shard among the ranks that hold it, with the
    // worker residual of the shard's elements.
    ExchangeCall inner = call;
    inner.x = shard_x;
    if (call.worker_residual.defined()) inner.worker_residual = call.worker_residual.narrow(0, shard.begin, shard.length);
    const at::Tensor mine = bytes_on(device, row_bytes, Buffer::kNodeMine).view(at::kFloat);
    int64_t across = 0;
    std::string failure;
    try {
      across = across_.allreduce(codec, host, inner, mine.narrow(0, 0, shard.length), levels_.lane);
      mine.narrow(0, width - 1, 1).fill_(0.0);
    } catch (const std::exception& e) {
      failure = e.what();
      mine.narrow(0, width - 1, 1).fill_(1.0);
    }

    // Inside the node, exact: every shard's sum to every local rank.
    flights.start_allgather(mine.view(at::kByte),
                            bytes_on(call.transport_device, local_ranks * row_bytes, Buffer::kNodeAll), levels_.node);
    const at::Tensor all = flights.finish(1).view(at::kFloat);
    TORCH_CHECK(failure.empty(), failure);
    const at::Tensor failed = all.view({local_ranks, width}).select(1, width - 1).ne(0).nonzero().cpu();
    TORCH_CHECK(failed.numel() == 0, "gradzip: the exchange across the nodes failed on local rank ",
                failed.numel() ? failed[0][0].item<int64_t>() : -1, " of this node for the tensor keyed '",
                call.key ? *call.key : "?", "'");
    for (int j = 0; j < local_ranks; ++j) {
      const Chunk c = exchange_chunk(n, local_ranks, j);
      sum.narrow(0, c.begin, c.length).copy_(all.narrow(0, j * width, c.length));
    }
    const int64_t inside = 2 * (local_ranks - 1) * row_bytes;
    return inside + across;
  }

 private:
  NodeLevels levels_;
  const Exchange& across_;
};

}  // namespace

std::unique_ptr<Exchange> hierarchical_exchange(NodeLevels levels, const Exchange& across) {
  return std::make_unique<HierarchicalExchange>(std::move(levels), across);
}

}  // namespace gradzip
