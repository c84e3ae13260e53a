// Hierarchical: exact inside each node, compressed across the nodes by a scheme
// (aggregate/exchange.h, hierarchical_exchange).
// The exact stages go through the node's shared memory for CPU tensors where the node
// has it (aggregate/node_shared_memory.h), else through the node's transport. Either
// way every rank publishes whether its exchange across the nodes failed, so that every
// rank of the node raises when one lane fails instead of waiting.
#include <c10/util/Exception.h>

#include <functional>
#include <vector>

#include "aggregate/exchange_flights.h"
#include "aggregate/node_shared_memory.h"

namespace gradzip {

int lane_rounds(const Codec& codec, int64_t shard, const NodeLevels& levels, int64_t requested) {
  return exchange_rounds(codec, shard, levels.lane->getSize(), requested, levels.node->getSize());
}

namespace {

class HierarchicalExchange final : public Exchange {
 public:
  HierarchicalExchange(NodeLevels levels, const ExchangeScheme& across)
      : levels_(std::move(levels)), scheme_(across), across_(across.exchange()) {
    TORCH_CHECK(levels_.node && levels_.lane, "gradzip: the hierarchical exchange needs a node and a lane transport");
  }
  Chunk owned(int64_t n, int, int) const override {
    const Chunk shard = exchange_chunk(n, levels_.node->getSize(), levels_.node->getRank());
    const Chunk inner = across_.owned(shard.length, levels_.lane->getSize(), levels_.lane->getRank());
    return {shard.begin + inner.begin, inner.length};
  }
  int64_t allreduce(const SlotCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                    const c10::intrusive_ptr<c10d::Backend>& transport) const override {
    TORCH_CHECK(levels_.node->getSize() * levels_.lane->getSize() == transport->getSize(), "gradzip: ",
                levels_.lane->getSize(), " nodes of ", levels_.node->getSize(), " ranks do not make the group's ",
                transport->getSize());
    return levels_.shared && call.x.device().is_cpu() ? through_shared_memory(codec, host, call, sum)
                                                      : through_node_transport(codec, host, call, sum);
  }

 private:
  // Across the nodes, compressed: this rank's shard (`shard_x`, the node's exact sum of
  // it) among the ranks that hold it, with the worker residual of the shard's elements,
  // into `shard_sum`, in `rounds` rounds (a two-phase lane calls `before_round` before
  // each). Returns the bytes sent, and what failed ("" when nothing did).
  std::pair<int64_t, std::string> across(const SlotCodec& codec, const Codec& host, const ExchangeCall& call,
                                         const Chunk& shard, const at::Tensor& shard_x, at::Tensor shard_sum,
                                         int rounds, std::function<void(int)> before_round = {}) const {
    ExchangeCall inner = call;
    inner.x = shard_x;
    inner.rounds = rounds;
    inner.before_round = std::move(before_round);
    if (call.worker_residual.defined()) inner.worker_residual = call.worker_residual.narrow(0, shard.begin, shard.length);
    try {
      return {across_.allreduce(*PartCodec(codec, shard), host, inner, shard_sum, levels_.lane), ""};
    } catch (const std::exception& e) {
      return {0, e.what()};
    }
  }

  // The steps of the node stage in the node's shared memory: a two-phase lane's rounds
  // when every shard of the node takes as many (lane_rounds; the shards differ by one
  // element at most), so that each step is one round's sub-pieces; else one step.
  int node_steps(const Codec& host, int64_t n, int64_t requested) const {
    if (!scheme_.in_rounds) return 1;
    const int local_ranks = levels_.node->getSize();
    const int rounds = lane_rounds(host, n / local_ranks, levels_, requested);
    return rounds == lane_rounds(host, largest_chunk(n, local_ranks), levels_, requested) ? rounds : 1;
  }

  // The elements of `shard` (shard-relative) in step s of `steps`: sub-piece s of each of
  // its lane chunks (round_piece), or all of it in one step.
  std::vector<Chunk> step_pieces(const Chunk& shard, int steps, int s) const {
    if (steps == 1) return {{0, shard.length}};
    const int nodes = levels_.lane->getSize();
    std::vector<Chunk> pieces;
    for (int j = 0; j < nodes; ++j) pieces.push_back(round_piece(shard.length, nodes, j, steps, s));
    return pieces;
  }

  // Raises on every rank of the node when the exchange across the nodes failed on one of
  // its ranks (`flags`: one per local rank, non-zero where it failed).
  void check_failures(const at::Tensor& flags, const std::string& failure, const ExchangeCall& call) const {
    TORCH_CHECK(failure.empty(), failure);
    const at::Tensor failed = flags.ne(0).nonzero().cpu();
    TORCH_CHECK(failed.numel() == 0, "gradzip: the exchange across the nodes failed on local rank ",
                failed.numel() ? failed[0][0].item<int64_t>() : -1, " of this node for the tensor keyed '",
                call.key ? *call.key : "?", "'");
  }

  // The exact stages in the node's shared memory: every rank writes x (plus its worker
  // residual) as its row, sums its shard of every row in local rank order, writes the
  // shard's sum across the nodes into the shared result, and reads the whole result.
  // Rows are written and summed in steps (node_steps), a barrier after each step's rows,
  // so that a two-phase lane sends round s while the node writes and sums round s + 1;
  // a barrier after the results. The next call writes into the other region
  // (NodeSharedMemory::next_region).
  int64_t through_shared_memory(const SlotCodec& codec, const Codec& host, const ExchangeCall& call,
                                at::Tensor sum) const {
    const int local_ranks = levels_.node->getSize();
    const int local = levels_.node->getRank();
    const int64_t n = call.x.numel();
    const Chunk shard = exchange_chunk(n, local_ranks, local);
    float* base = reinterpret_cast<float*>(levels_.shared->next_region(4 * ((local_ranks + 1) * n + local_ranks)));
    const auto shared = [&](int64_t offset, int64_t length) {
      return at::from_blob(base + offset, {length}, at::dtype(at::kFloat));
    };
    const at::Tensor shard_x = bytes_on(call.x.device(), 4 * shard.length, Buffer::kShard).view(at::kFloat);
    const int steps = node_steps(host, n, call.rounds);
    int steps_done = 0;
    bool node_failed = false;
    // The steps up to `last`: this rank's row over the step's pieces of every shard, a
    // barrier, then the step's pieces of its own shard summed over the rows.
    const auto stage_through = [&](int last) {
      for (; steps_done <= last; ++steps_done) {
        for (int l = 0; l < local_ranks; ++l) {
          const Chunk owner = exchange_chunk(n, local_ranks, l);
          for (const Chunk& piece : step_pieces(owner, steps, steps_done)) {
            const int64_t begin = owner.begin + piece.begin;
            at::Tensor row = shared(local * n + begin, piece.length);
            if (call.worker_residual.defined()) {
              at::Tensor residual = call.worker_residual.narrow(0, begin, piece.length);
              at::add_out(row, call.x.narrow(0, begin, piece.length), residual);
              residual.zero_();
            } else {
              row.copy_(call.x.narrow(0, begin, piece.length));
            }
          }
        }
        try {
          levels_.shared->barrier();
        } catch (...) {
          node_failed = true;
          throw;
        }
        for (const Chunk& piece : step_pieces(shard, steps, steps_done)) {
          at::Tensor part = shard_x.narrow(0, piece.begin, piece.length);
          part.copy_(shared(shard.begin + piece.begin, piece.length));
          for (int j = 1; j < local_ranks; ++j) part.add_(shared(j * n + shard.begin + piece.begin, piece.length));
        }
      }
    };
    if (steps == 1) stage_through(0);
    const at::Tensor result = shared(local_ranks * n, n);
    const at::Tensor flags = shared((local_ranks + 1) * n, local_ranks);
    const auto [sent, failure] =
        across(codec, host, call, shard, shard_x, result.narrow(0, shard.begin, shard.length),
               steps > 1 ? steps : lane_rounds(host, shard.length, levels_, call.rounds),
               steps > 1 ? std::function<void(int)>(stage_through) : std::function<void(int)>());
    TORCH_CHECK(!node_failed, failure);
    if (steps_done < steps) stage_through(steps - 1);  // the lane failed midway: the node's other ranks still step
    flags[local].fill_(failure.empty() ? 0.0 : 1.0);
    levels_.shared->barrier();
    check_failures(flags, failure, call);
    sum.copy_(result);
    return sent;
  }

  // The exact stages over the node's transport: an all-to-all of fp32 rows (chunk j of x
  // plus the worker residual to local rank j, summed there in local rank order), then an
  // all-gather of the shards' sums, each row one element longer than the longest chunk
  // for its rank's failure flag.
  int64_t through_node_transport(const SlotCodec& codec, const Codec& host, const ExchangeCall& call,
                                 at::Tensor sum) const {
    const int local_ranks = levels_.node->getSize();
    const int local = levels_.node->getRank();
    const int64_t n = call.x.numel();
    const Chunk shard = exchange_chunk(n, local_ranks, local);
    const int64_t width = largest_chunk(n, local_ranks) + 1;  // a chunk, then the status
    const int64_t row_bytes = 4 * width;
    const at::Device device = call.x.device();
    Flights flights(call);
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

    const at::Tensor mine = bytes_on(device, row_bytes, Buffer::kNodeMine).view(at::kFloat);
    const auto [sent, failure] = across(codec, host, call, shard, shard_x, mine.narrow(0, 0, shard.length),
                                        lane_rounds(host, shard.length, levels_, call.rounds));
    mine.narrow(0, width - 1, 1).fill_(failure.empty() ? 0.0 : 1.0);
    flights.start_allgather(mine.view(at::kByte),
                            bytes_on(call.transport_device, local_ranks * row_bytes, Buffer::kNodeAll), levels_.node);
    const at::Tensor all = flights.finish(1).view(at::kFloat);
    check_failures(all.view({local_ranks, width}).select(1, width - 1), failure, call);
    for (int j = 0; j < local_ranks; ++j) {
      const Chunk c = exchange_chunk(n, local_ranks, j);
      sum.narrow(0, c.begin, c.length).copy_(all.narrow(0, j * width, c.length));
    }
    return 2 * (local_ranks - 1) * row_bytes + sent;
  }

  NodeLevels levels_;
  const ExchangeScheme& scheme_;
  const Exchange& across_;
};

}  // namespace

std::unique_ptr<Exchange> hierarchical_exchange(NodeLevels levels, const ExchangeScheme& across) {
  return std::make_unique<HierarchicalExchange>(std::move(levels), across);
}

namespace {

// The chunks (rows of x viewed P × m) of the ranks of lane `local`, node by node.
std::vector<int64_t> lane_chunks(const NodeLevels& levels, int local) {
  const int local_ranks = levels.node->getSize();
  std::vector<int64_t> chunks;
  for (int k = 0; k < levels.lane->getSize(); ++k) chunks.push_back(levels.ranks[k * local_ranks + local]);
  return chunks;
}

at::Tensor index_on(const std::vector<int64_t>& indices, const at::Device& device) {
  return at::tensor(indices, at::kLong).to(device);
}

}  // namespace

int64_t hierarchical_reduce_scatter(const NodeLevels& levels, const SlotCodec& codec, const Codec& host,
                                    const ExchangeCall& call, at::Tensor shard,
                                    const c10::intrusive_ptr<c10d::Backend>& transport) {
  const int local_ranks = levels.node->getSize(), nodes = levels.lane->getSize();
  const int local = levels.node->getRank(), node = levels.lane->getRank();
  TORCH_CHECK(local_ranks * nodes == transport->getSize() &&
                  levels.ranks.size() == static_cast<size_t>(transport->getSize()),
              "gradzip: ", nodes, " nodes of ", local_ranks, " ranks do not make the group's ", transport->getSize());
  TORCH_CHECK(levels.ranks[node * local_ranks + local] == transport->getRank(), "gradzip: the node levels name rank ",
              levels.ranks[node * local_ranks + local], " as local rank ", local, " of node ", node, ", which is rank ",
              transport->getRank());
  const int64_t m = shard.numel(), n = call.x.numel(), lane_length = nodes * m;
  const at::Device device = call.x.device();
  const at::Tensor shard_x = bytes_on(device, 4 * lane_length, Buffer::kShard).view(at::kFloat);
  const std::vector<int64_t> chunks = lane_chunks(levels, local);
  const at::Tensor mine = index_on(chunks, device);
  const int rounds = lane_rounds(host, lane_length, levels, call.rounds);
  int64_t node_bytes = 0;
  std::function<void(int)> node_round;
  int rounds_staged = 0;
  bool node_failed = false;
  if (levels.shared && device.is_cpu()) {
    // Every rank writes x (plus its worker residual) as its row and, after a barrier, sums
    // its lane's chunks of every row, one lane round's columns at a time (the columns of
    // round s of every chunk: exchange_chunk(m, rounds, s)), called by the lane before it
    // encodes that round, so that the lane sends round s while the node writes and sums
    // round s + 1. The next call writes into the other region.
    float* base = reinterpret_cast<float*>(levels.shared->next_region(4 * local_ranks * n));
    const auto row = [base, n, m, rows = int64_t{local_ranks} * nodes](int j) {
      return at::from_blob(base + j * n, {rows, m}, at::kFloat);
    };
    node_round = [&, row](int s) {
      const Chunk c = exchange_chunk(m, rounds, s);
      at::Tensor written = row(local).narrow(1, c.begin, c.length);
      const at::Tensor x = call.x.view({local_ranks * nodes, m}).narrow(1, c.begin, c.length);
      if (call.worker_residual.defined()) {
        at::add_out(written, x, call.worker_residual.view({local_ranks * nodes, m}).narrow(1, c.begin, c.length));
      } else {
        written.copy_(x);
      }
      try {
        levels.shared->barrier();
      } catch (...) {
        node_failed = true;
        throw;
      }
      for (int k = 0; k < nodes; ++k) {
        at::Tensor sum = shard_x.narrow(0, k * m + c.begin, c.length);
        sum.copy_(row(0)[chunks[k]].narrow(0, c.begin, c.length));
        for (int j = 1; j < local_ranks; ++j) sum.add_(row(j)[chunks[k]].narrow(0, c.begin, c.length));
      }
      ++rounds_staged;
    };
  } else {
    // An all-to-all of fp32 rows: local rank j gets this rank's chunks of lane j.
    std::vector<int64_t> by_lane;
    for (int j = 0; j < local_ranks; ++j) {
      const std::vector<int64_t> lane = lane_chunks(levels, j);
      by_lane.insert(by_lane.end(), lane.begin(), lane.end());
    }
    const int64_t row_bytes = 4 * lane_length;
    const at::Tensor rows = bytes_on(device, local_ranks * row_bytes, Buffer::kNodeSend).view(at::kFloat);
    const at::Tensor x = call.worker_residual.defined() ? call.x + call.worker_residual : call.x;
    at::Tensor slots = rows.view({local_ranks * nodes, m});
    at::index_select_out(slots, x.view({local_ranks * nodes, m}), 0, index_on(by_lane, device));
    Flights flights(call);
    flights.start_alltoall(rows.view(at::kByte),
                           bytes_on(call.transport_device, local_ranks * row_bytes, Buffer::kNodeReceived),
                           levels.node);
    const at::Tensor received = flights.finish(0).view(at::kFloat);
    shard_x.copy_(received.narrow(0, 0, lane_length));
    for (int j = 1; j < local_ranks; ++j) shard_x.add_(received.narrow(0, j * lane_length, lane_length));
    node_bytes = (local_ranks - 1) * row_bytes;
  }
  // Across the nodes: the lane's compressed reduce-scatter, with a residual of the lane's
  // chunks (the rest of the worker residual went into the node's sum), in a lane's rounds.
  ExchangeCall inner = call;
  inner.x = shard_x;
  inner.rounds = rounds;
  inner.before_round = node_round;
  at::Tensor lane_residual;
  if (call.worker_residual.defined()) {
    lane_residual = at::zeros({lane_length}, call.worker_residual.options());
    inner.worker_residual = lane_residual;
  }
  int64_t sent = 0;
  try {
    sent = compressed_reduce_scatter(codec, host, inner, shard, levels.lane);
  } catch (...) {
    // The lane failed before it staged every round: the node's other ranks still step.
    while (node_round && !node_failed && rounds_staged < rounds) node_round(rounds_staged);
    throw;
  }
  if (lane_residual.defined()) {
    call.worker_residual.zero_();
    call.worker_residual.view({local_ranks * nodes, m}).index_copy_(0, mine, lane_residual.view({nodes, m}));
  }
  return node_bytes + sent;
}

}  // namespace gradzip
