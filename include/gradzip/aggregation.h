// Aggregation: how a gradzip process group all-reduces a tensor.
//
// An Aggregation is made from a BoundSpec (gradzip/bound_spec.h) by make_aggregation().
// It reduces a tensor in place over a transport (a c10d::Backend such as Gloo or NCCL)
// and promises that every rank ends with a bitwise-identical result. It does not know
// whether the call came from the backend or from a DDP comm hook.
//
// State (error-feedback residuals, step counters, CHOCO's public copies) is the
// aggregation's own: it is kept per logical tensor, named by the caller's key, and
// leaves only as named tensors through state_dict() / load_state_dict().
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "gradzip/bound_spec.h"
#include "gradzip/stats.h"

namespace gradzip {

// A tensor that is the concatenation of named pieces (a DDP bucket of parameters): state
// is kept per piece, so it follows a piece into another bucket layout.
struct TensorPiece {
  std::string key;
  int64_t numel;
};

class NodeSharedMemory;  // aggregate/node_shared_memory.h

// A transport's ranks in two levels (aggregate/exchange.h, the hierarchical exchange):
// `node` joins this rank with the others of its node (the fast links), `lane` joins it
// with the rank of the same local index on every other node (the slow links). Every node
// holds node->getSize() ranks; this rank is node->getRank() on its node, whose index
// among the nodes is lane->getRank(). `ranks`: the transport rank of local rank l of node
// k at k·node->getSize() + l (a reduce-scatter must know whose chunk each rank holds).
// `shared` (optional, CPU tensors): memory the ranks of the node share, which the exact
// stages then use instead of the node transport.
struct NodeLevels {
  c10::intrusive_ptr<c10d::Backend> node;
  c10::intrusive_ptr<c10d::Backend> lane;
  std::vector<int64_t> ranks;
  std::shared_ptr<NodeSharedMemory> shared;
};

class Aggregation {
 public:
  explicit Aggregation(BoundSpec spec) : spec_(std::move(spec)) {}
  virtual ~Aggregation() = default;
  Aggregation(const Aggregation&) = delete;
  Aggregation& operator=(const Aggregation&) = delete;

  const BoundSpec& spec() const { return spec_; }

  // Reduces `tensors` (c10d's one-tensor list) in place across every rank of
  // `transport` with opts.reduceOp, and adds the bytes it moves to `stats`. `key`
  // names the logical tensor whose state (error feedback) this call uses; every
  // rank must pass the same key. The returned Work completes when the result is in
  // place; its future holds the tensor list, as c10d's allreduce does. `all_finite`: for
  // a tensor it takes finiteness_from_caller(), whether every rank's input is finite, as
  // the caller already agreed with every rank (each rank's locally_finite(), aggregate/
  // finite_step.h); nullopt: the aggregation agrees on it itself, in an exchange of its own.
  virtual c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
      const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats, const std::string& key,
      std::optional<bool> all_finite = std::nullopt) = 0;

  // Whether allreduce() of `tensor`, which agrees with every rank on whether all inputs
  // are finite before it touches its state (error feedback must not absorb an Inf),
  // takes that answer from a caller that exchanges a message per call anyway (the
  // backend's collective check): the caller reads its input for its flag, carries it in
  // that message and passes every rank's answer as `all_finite`, saving an exchange.
  // False also where the aggregation reads a large input before the agreement anyway and
  // checks it in that pass (its own exchange of a flag then costs less than a second read).
  virtual bool finiteness_from_caller(const at::Tensor& tensor) const { return false; }

  // The same, for a tensor made of `pieces` (their numels add up to its numel): the
  // state of each piece is kept under the piece's key. Aggregations without per-element
  // state treat the tensor as one.
  virtual c10::intrusive_ptr<c10d::Work> allreduce_pieces(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
      const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats, const std::vector<TensorPiece>& pieces);

  // Reduces `input` (P × output.numel() elements, P the ranks of `transport`; the dtype
  // and device of `output`) across every rank with opts.reduceOp; rank r's `output` gets
  // elements [r·m, (r + 1)·m) of the result, m = output.numel(). `key` names the state, as
  // for allreduce(); every rank passes the same key. The default is the transport's exact
  // reduce-scatter; compressed aggregations compress it (aggregate/compressed_allreduce.h).
  virtual c10::intrusive_ptr<c10d::Work> reduce_scatter(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts,
      const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats, const std::string& key);

  // The same, for an input whose P chunks are each `pieces` end to end (their numels add
  // up to output.numel(): FSDP's reduce-scatter input, every rank's shard of each
  // parameter, in order): layer-aware aggregations compress each piece of each chunk by
  // itself, keeping the state of the whole input under `key` and what they choose per
  // piece under "<key>/<piece key>". Aggregations without layers ignore the pieces.
  virtual c10::intrusive_ptr<c10d::Work> reduce_scatter_pieces(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts,
      const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats, const std::string& key,
      const std::vector<TensorPiece>& pieces);

  // The state as named tensors, "<key>/<field>" (fields: residual, calls, step,
  // public_copy_<rank>), on the CPU; load_state_dict() restores it exactly.
  virtual std::map<std::string, at::Tensor> state_dict() const { return {}; }
  // Drops the state kept under these keys (the tensors they named are gone); a key used
  // again starts afresh.
  virtual void forget(const std::vector<std::string>& keys) {}
  virtual void load_state_dict(const std::map<std::string, at::Tensor>& state);

  // The loss scale (torch.amp.GradScaler's) that the inputs of the next calls carry.
  // Aggregations with error feedback keep each residual in the units of the scale it was
  // made under and rescale it by new/old when the scale changes, so that a scale that
  // halves or doubles does not mis-weight what earlier steps left unsent. Others ignore it.
  virtual void set_loss_scale(double scale) {}

  // Tells the aggregation how `transport`'s ranks sit in nodes, so that its calls over
  // that transport may reduce exactly inside a node and compress only across nodes.
  // Aggregations that cannot use it ignore it.
  virtual void use_node_levels(const c10::intrusive_ptr<c10d::Backend>& transport, NodeLevels levels) {}

 private:
  BoundSpec spec_;
};

// One registered kind of aggregation: its spec name, what it does, its own keys, where
// its codec comes from, and how to make it.
struct AggregationKind {
  enum class CodecFrom { kNone, kName, kCompressKey };
  std::string name;
  std::string summary;
  std::vector<SpecKey> keys;  // its own; a codec's keys come from the codec's record
  CodecFrom codec_from = CodecFrom::kNone;
  bool decentralized = false;
  std::function<void(const BoundSpec&)> check;  // rules that tie keys together, checked at bind (may be empty)
  std::function<std::unique_ptr<Aggregation>(const BoundSpec&)> make;
};

// Every registered kind, in the order they are listed in error messages.
const std::vector<AggregationKind>& aggregation_kinds();

// Every key a kind takes, its codec's included (for choco: every codec's), for listings.
std::vector<SpecKey> all_keys(const AggregationKind& kind);

std::unique_ptr<Aggregation> make_aggregation(const BoundSpec& spec);

}  // namespace gradzip
