// Exchange: how a compressed all-reduce moves its payloads between the ranks, the same
// code for CPU and CUDA tensors (a TensorCodec encodes and decodes on the tensor's
// device; the transport moves the bytes).
//
// one-shot: every rank encodes its whole vector; the payloads are all-gathered; every
//   rank decodes all P of them in rank order. Sends (P − 1)·c(n) bytes per rank.
// two-phase: every rank encodes its vector as P chunks (chunk j = elements
//   [⌊j·n/P⌋, ⌊(j+1)·n/P⌋)), all-to-all; rank j decodes the P pieces of chunk j in rank
//   order into fp32, adds its owner residual, re-encodes (its owner residual keeps what
//   that encoding did not carry) and all-gathers; every rank decodes the P chunks.
//   Sends 2·(P − 1)·c(n/P) bytes per rank: flat in P.
//   Pipelined in rounds: each chunk is cut into S sub-pieces (sub-piece s of chunk j =
//   exchange_chunk(chunk j's length, S, s) within it) and round s moves sub-piece s of
//   every chunk, through both phases. Every round's all-to-all is started as soon as it
//   is encoded and every round's all-gather as soon as its owner part is re-encoded, so
//   the transport moves round s while the codec works on round s + 1 (the transport's
//   collectives are asynchronous: Gloo's and MPI's run on threads of their own, NCCL's
//   on its stream). Chunks, ownership and owner residuals do not depend on S; an
//   element-wise codec (identity, fp16, bf16, sign without blocks) gives the same bits
//   for every S, a codec that selects or scales per block selects per sub-piece.
// hierarchical (the transport's ranks in N nodes of L, gradzip/aggregation.h NodeLevels):
//   an exact fp32 reduce-scatter inside each node (local rank l gets the node's sum of
//   chunk l of L, its shard), a compressed all-reduce of the shard across the nodes among
//   the ranks that hold the same shard (one-shot or two-phase over the lane, error
//   feedback per shard), then an exact all-gather of the shards inside the node. The
//   slow links carry each node's compressed bytes once: c(n/L) per rank instead of
//   c(n). Any worker residual is folded into the node's exact sum (nothing is lost
//   when a tensor moves between a flat and a hierarchical exchange); the rank keeps a
//   worker residual for its shard only.
//   In the node's shared memory the exact reduce-scatter runs in the lane's two-phase
//   rounds (ExchangeCall::before_round): the node writes and sums round s + 1 while the
//   lane sends round s.
// dense: the transport's own all-reduce, 2·(P − 1)/P·n·(element size) bytes per rank.
// reduce-scatter: two-phase's first half; rank j ends with the sum of chunk j, decoded
//   in rank order into fp32. Sends (P − 1)·c(n/P) bytes per rank, against the ring's
//   (P − 1)/P·n·(element size). Any n and P: chunks differ by one element at most, no
//   padding is sent.
//
// Payloads travel in slots (aggregate/slots.h) of a size known from the codec and n (no
// size exchange). All ranks decode the same payloads in the same order, so all end
// bitwise identical. A payload that cannot be decoded raises on every rank: in
// two-phase, an owner that cannot decode a piece sends a failed slot, which every rank
// reports.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <memory>
#include <string>

#include "aggregate/tensor_codec.h"
#include "gradzip/aggregation.h"
#include "gradzip/codec.h"

namespace gradzip {

enum class ExchangeScheme { kDense, kOneShot, kTwoPhase, kHierarchical };
const char* exchange_name(ExchangeScheme scheme);

// What a spec's `exchange` key asks for: auto, oneshot or twophase.
enum class ExchangeRequest { kAuto, kOneShot, kTwoPhase };
ExchangeRequest parse_exchange_request(const std::string& value);
// The request of a compressed spec's `exchange` key (auto when it has none).
ExchangeRequest exchange_request(const Spec& spec);

// The rounds of a two-phase exchange (or a compressed reduce-scatter) of n elements over
// `ranks`: `requested` when it is above 0 (the spec's `rounds` key), else automatic:
// one round per kRoundBytes of what the exchanges sharing a link send over it in the
// first phase (`link_shared_by` exchanges alike: a hierarchical exchange's lanes share
// their node's link), at most kMaxRounds, and at most one per kMinRoundElements of a
// chunk. Never more rounds than elements in the smallest chunk, never fewer than one.
constexpr int64_t kRoundBytes = int64_t{4} << 20;
constexpr int kMaxRounds = 8;
constexpr int64_t kMinRoundElements = 4096;
int exchange_rounds(const Codec& codec, int64_t n, int ranks, int64_t requested = 0, int link_shared_by = 1);
// The spec's `rounds` key: 0 (automatic) when it has none.
int64_t rounds_request(const Spec& spec);

// Bytes one rank sends for an all-reduce of n elements of `element_bytes` each over
// `ranks` ranks, by each scheme (slot framing included; two-phase in `rounds` rounds).
struct ExchangeCost {
  int64_t dense;
  int64_t oneshot;
  int64_t twophase;
  int rounds;
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

// auto: the scheme that sends the fewest bytes, dense when neither compressed scheme
// sends fewer than the dense ring (ties go to dense, then one-shot), and two-phase only
// when its owners' second encode of the summed chunk loses next to nothing
// (`reencodes_losslessly`: Codec::reencodes_losslessly, the casts). For any other codec
// that second compression costs accuracy: on the demo CNN (docs/results.md "Main job",
// 3 seeds) one-shot ends 1.1 points higher for QSGD 4-bit, 2.9 for sign and 3 for STC,
// and a selection codec without error feedback would drop for good what the owners'
// second selection leaves out (the sum of sparse inputs would no longer be exact).
// Where one-shot sends no fewer bytes than the ring (many ranks) but two-phase does, a
// lossy codec takes two-phase: compressed twice rather than not at all. oneshot and
// twophase are taken as asked. Where two-phase is allowed, in several
// rounds it is taken over one-shot when it sends at most 5% more: its rounds overlap the
// codec with the wire, one-shot's encode, all-gather and decode follow each other (2
// ranks, or the 2 nodes of a hierarchical exchange, where the two send about as much).
ExchangeScheme choose_exchange(ExchangeRequest request, const ExchangeCost& cost, bool reencodes_losslessly = true);
// choose_exchange with the rules of `codec`: the choice every door makes.
inline ExchangeScheme choose_exchange_for(const Codec& codec, ExchangeRequest request, const ExchangeCost& cost) {
  return choose_exchange(request, cost, codec.reencodes_losslessly());
}

// Chunk j of n elements split over `ranks`: [begin, begin + length), begin = ⌊j·n/ranks⌋.
struct Chunk {
  int64_t begin;
  int64_t length;
};
Chunk exchange_chunk(int64_t n, int ranks, int j);

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
};

// A compressed scheme: how one all-reduce's payloads travel (one file each:
// aggregate/oneshot_exchange.cpp, aggregate/twophase_exchange.cpp,
// aggregate/hierarchical_exchange.cpp).
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual ExchangeScheme scheme() const = 0;
  // The elements of an n-element tensor that `rank` reduces for the others, and keeps
  // an owner residual for with error feedback (two-phase: its chunk); none otherwise.
  virtual Chunk owned(int64_t n, int ranks, int rank) const = 0;
  // Writes scale × the sum over the ranks into `sum` (contiguous float32, n elements, on
  // the codec's device) and returns the bytes this rank sent.
  virtual int64_t allreduce(const TensorCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                            const c10::intrusive_ptr<c10d::Backend>& transport) const = 0;
};
const Exchange& oneshot_exchange();
const Exchange& twophase_exchange();
// The hierarchical exchange over `levels`, compressing across the nodes by `across`
// (one-shot or two-phase). Its transport argument is the flat one (unused but for checks).
std::unique_ptr<Exchange> hierarchical_exchange(NodeLevels levels, const Exchange& across);
// The rounds of a lane's two-phase exchange across `levels`' nodes of a shard of `shard`
// elements: exchange_rounds among the lane with the node's lanes counted together, since
// they send over the node's one link at once.
int lane_rounds(const Codec& codec, int64_t shard, const NodeLevels& levels, int64_t requested);
// The exchange of a flat compressed scheme (one-shot or two-phase).
const Exchange& exchange_of(ExchangeScheme scheme);

// Writes scale × the sum over the ranks of chunk `rank` of x (exchange_chunk) into
// `shard` (contiguous float32 of that length, on the codec's device) and returns the
// bytes this rank sent. The owner_residual and majority fields are not used. A piece
// that cannot be decoded raises on its owner only (no rank hears back from another).
int64_t compressed_reduce_scatter(const TensorCodec& codec, const Codec& host, const ExchangeCall& call,
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
int64_t hierarchical_reduce_scatter(const NodeLevels& levels, const TensorCodec& codec, const Codec& host,
                                    const ExchangeCall& call, at::Tensor shard,
                                    const c10::intrusive_ptr<c10d::Backend>& transport);

}  // namespace gradzip
