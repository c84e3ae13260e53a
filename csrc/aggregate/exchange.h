// Exchange: how a compressed all-reduce moves its payloads between the ranks, the same
// code for CPU and CUDA tensors (a SlotCodec encodes and decodes on the tensor's
// device; the transport moves the bytes). Each scheme is a record (ExchangeScheme) and
// an Exchange in its own file, listed once in aggregate/exchange_schemes.cpp; the spec's
// `exchange` key names one, or auto, which chooses by bytes (choose_exchange). A
// hierarchical exchange (aggregate/hierarchical_exchange.cpp) wraps a scheme across
// the nodes. The dense choice is the transport's own all-reduce.
//
// Payloads travel in slots (aggregate/slots.h) of a size known from the codec and n (no
// size exchange). All ranks decode the same payloads in the same order, so all end
// bitwise identical. A payload that cannot be decoded raises on every rank.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aggregate/exchange_rounds.h"
#include "aggregate/slot_codec.h"
#include "gradzip/aggregation.h"
#include "gradzip/codec.h"

namespace gradzip {

class Exchange;

// A compressed scheme's record: everything auto and the doors need to know of it.
struct ExchangeScheme {
  std::string name;     // as the spec's `exchange` key names it
  std::string summary;  // how its payloads travel, for the key's help
  // Its owners re-encode a sum of decoded pieces, compressing a lossy codec twice.
  bool compresses_twice = false;
  // It runs in exchange_rounds(...) rounds that overlap the codec with the wire, and
  // calls ExchangeCall::before_round before each (one-shot is pipelined too, but in
  // rounds of its own, oneshot_rounds, and calls nothing).
  bool in_rounds = false;
  // Bytes one rank sends for an all-reduce of n elements over `ranks`, in the rounds it
  // takes when `rounds_requested` are asked for (0: its own choice), slot framing
  // included: what gradzip.stats() counts for such a call.
  int64_t (*bytes)(const Codec& codec, int64_t n, int ranks, int64_t rounds_requested) = nullptr;
  // The scheme's exchange (stateless, shared by every call).
  const Exchange& (*exchange)() = nullptr;
};
// Every scheme, in the order auto breaks ties in.
const std::vector<const ExchangeScheme*>& exchange_schemes();
// Each scheme's record (aggregate/oneshot_exchange.cpp, aggregate/twophase_exchange.cpp).
const ExchangeScheme& oneshot_scheme();
const ExchangeScheme& twophase_scheme();
// The scheme of a name; null when there is none.
const ExchangeScheme* find_exchange_scheme(const std::string& name);

// What a spec's `exchange` key asks for: a scheme, or null for auto (SpecError naming
// the choices for anything else).
const ExchangeScheme* parse_exchange_request(const std::string& value);
// The request of a compressed spec's `exchange` key (auto when it has none).
const ExchangeScheme* exchange_request(const Spec& spec);

// Bytes one rank sends for an all-reduce of n elements of `element_bytes` each over
// `ranks` ranks: by the transport's dense ring, and by each scheme (in `rounds` rounds).
struct ExchangeCost {
  int64_t dense;
  int rounds;
  std::vector<int64_t> schemes;  // in exchange_schemes()'s order
  // The bytes of the scheme named `name` (std::out_of_range when there is none).
  int64_t of(const std::string& name) const;
};
ExchangeCost exchange_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks,
                           int64_t rounds_requested = 0);

// Bytes one rank sends for a reduce-scatter of n elements over `ranks` ranks: the
// transport's ring, and the compressed exchange (slot framing included).
struct ReduceScatterCost {
  int64_t dense;
  int64_t compressed;
};
ReduceScatterCost reduce_scatter_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks,
                                      int64_t rounds_requested = 0);

// The scheme of a call; null for the transport's dense all-reduce. A requested scheme is
// taken as asked. auto (`request` null) takes the scheme that sends the fewest bytes,
// dense when none sends fewer than the ring (ties go to dense, then to the earlier
// scheme; schemes within 0.1% of each other tie, so that the framing of one-shot's
// rounds does not decide), with two rules:
// - a scheme that compresses twice is taken only where the codec re-encodes losslessly
//   (`reencodes_losslessly`: Codec::reencodes_losslessly, the casts), or where no scheme
//   that compresses once sends fewer bytes than the ring (many ranks: compressed twice
//   rather than not at all). For any other codec the second compression costs accuracy:
//   on the demo CNN (docs/results.md "Main job", 3 seeds) one-shot ends 1.1 points higher
//   than two-phase for QSGD 4-bit, 2.9 for sign and 3 for STC, and a selection codec
//   without error feedback would drop for good what the owners' second selection leaves
//   out;
// - in several rounds, a scheme that runs in rounds is taken over the fewest bytes when
//   it sends at most 5% more (2 ranks, or the 2 nodes of a hierarchical exchange, where
//   one-shot and two-phase send about as much): across the nodes its rounds also overlap
//   the node stage (before_round).
const ExchangeScheme* choose_exchange(const ExchangeScheme* request, const ExchangeCost& cost,
                                      bool reencodes_losslessly = true);
// choose_exchange with the rules of `codec`: the choice every door makes.
inline const ExchangeScheme* choose_exchange_for(const Codec& codec, const ExchangeScheme* request,
                                                 const ExchangeCost& cost) {
  return choose_exchange(request, cost, codec.reencodes_losslessly());
}

// One all-reduce's inputs. `x`: contiguous float32 on the codec's device, read before
// anything is written to `sum`, so the two may be the same tensor. The residuals are
// undefined without error feedback; `owner_residual` (two-phase) has the length of this
// rank's chunk.
struct ExchangeCall {
  at::Tensor x;
  at::Tensor worker_residual;
  at::Tensor owner_residual;
  EncodeContext ctx;
  bool majority = false;  // two-phase owners vote: sign of the sum of their pieces
  float scale = 1.0f;     // the result is scale × the sum (AVG: 1/P), applied as it is decoded
  int64_t rounds = 0;     // two-phase and reduce-scatter rounds asked for (0: exchange_rounds decides)
  const std::string* key = nullptr;  // names the tensor in error messages
  // Where the transport takes its buffers (NCCL: the GPU, also for a codec that runs
  // on the host); slots are copied there and back when it is not x's device.
  at::Device transport_device = at::kCPU;
  // Phase one (two-phase, reduce-scatter) calls it with s = 0, 1, …, rounds − 1, each
  // before it reads round s's sub-pieces of x and of the worker residual: a hierarchical
  // exchange writes that part of x there, so that its node stage of round s + 1 runs
  // while round s is on the wire.
  std::function<void(int)> before_round;
  // `sum` already holds zeros (the host's momentum pass zeroed it): one-shot adds into it.
  bool sum_zeroed = false;
};

// How one all-reduce's payloads travel: a scheme's (its record's `exchange`), or a
// hierarchical exchange over one.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // The elements of an n-element tensor that `rank` reduces for the others, and keeps
  // an owner residual for with error feedback (two-phase: its chunk); none otherwise.
  virtual Chunk owned(int64_t n, int ranks, int rank) const = 0;
  // Writes scale × the sum over the ranks into `sum` (contiguous float32, n elements, on
  // the codec's device) and returns the bytes this rank sent.
  virtual int64_t allreduce(const SlotCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                            const c10::intrusive_ptr<c10d::Backend>& transport) const = 0;
};
// The hierarchical exchange over `levels`: an exact fp32 reduce-scatter inside each node
// (local rank l gets the node's sum of chunk l of L, its shard), `across`'s compressed
// all-reduce of the shard among the ranks of the other nodes that hold the same shard
// (error feedback per shard), then an exact all-gather of the shards inside the node.
// The slow links carry each node's compressed bytes once: c(n/L) per rank instead of
// c(n). Any worker residual is folded into the node's exact sum (nothing is lost when a
// tensor moves between a flat and a hierarchical exchange); the rank keeps a worker
// residual for its shard only. In the node's shared memory the exact reduce-scatter runs
// in the rounds of an `across` that runs in rounds (ExchangeCall::before_round): the
// node writes and sums round s + 1 while the lane sends round s. Its transport argument
// is the flat one (unused but for checks).
std::unique_ptr<Exchange> hierarchical_exchange(NodeLevels levels, const ExchangeScheme& across);
// The rounds of a lane's exchange in rounds across `levels`' nodes of a shard of `shard`
// elements: exchange_rounds among the lane with the node's lanes counted together, since
// they send over the node's one link at once.
int lane_rounds(const Codec& codec, int64_t shard, const NodeLevels& levels, int64_t requested);

// Two-phase's first half: writes scale × the sum over the ranks of chunk `rank` of x
// (exchange_chunk), its pieces decoded in rank order into fp32, into `shard` (contiguous
// float32 of that length, on the codec's device) and returns the bytes this rank sent:
// (P − 1)·c(n/P) against the ring's (P − 1)/P·n·(element size), for any n and P (chunks
// differ by one element at most, no padding is sent). The owner_residual and majority fields are not used. A piece
// that cannot be decoded raises on its owner only (no rank hears back from another).
int64_t compressed_reduce_scatter(const SlotCodec& codec, const Codec& host, const ExchangeCall& call,
                                  at::Tensor shard, const c10::intrusive_ptr<c10d::Backend>& transport);

// compressed_reduce_scatter's result over `levels` (with P = its nodes × ranks per node
// equal chunks of x): an exact fp32 reduce-scatter inside the node, where local rank l
// gets the node's sum of the chunks of every rank of lane l (summed in local rank order;
// in the node's shared memory for CPU tensors where it has it), then the compressed
// reduce-scatter of those among the lane (in lane_rounds), which leaves each rank its
// own chunk. The worker residual (x's length) goes into the node's exact sum; what the
// lane's encode leaves unsent is kept in the residual's rows of the chunks this rank
// compressed.
// In shared memory the node's sums run in the lane's rounds, as the all-reduce's do.
// Returns the bytes this rank sent.
int64_t hierarchical_reduce_scatter(const NodeLevels& levels, const SlotCodec& codec, const Codec& host,
                                    const ExchangeCall& call, at::Tensor shard,
                                    const c10::intrusive_ptr<c10d::Backend>& transport);

}  // namespace gradzip
