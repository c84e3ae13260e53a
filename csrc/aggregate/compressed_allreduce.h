// CompressedAllreduce: all-reduce through a codec (gradzip/codec.h), moved by an
// exchange (aggregate/exchange.h): one-shot (all-gather of whole payloads), two-phase
// (all-to-all of chunks, owners reduce and re-encode, all-gather) or dense, chosen per
// call by the spec's `exchange` key (auto: the fewest bytes for this P, n and codec).
// All ranks decode the same payloads in the same order into an fp32 sum, so all end
// bitwise identical. AVG scales each decoded payload by 1/P as it is added; vote=majority (sign)
// returns the sign of the summed votes (one-shot: 0 on a tie; two-phase: the owner's
// vote is a sign bit, +1 on a tie). When a payload cannot be decoded, every rank raises
// and the tensor's contents are unspecified.
//
// Compressed: fp32, fp16 and bf16 tensors (math in fp32, the result cast back) with
// SUM or AVG. Everything else — other dtypes, other ops, tensors below min_numel, the
// first `warmup` calls of each tensor, auto's dense choice — goes through the
// transport's exact all-reduce. With density_warmup (topk, randomk, stc), the next
// density_warmup calls of each tensor use a denser codec in four equal stages (DGC's
// warm-up): density max(d, 0.25·4^−s) in stage s; all ranks count calls alike, so all
// agree on each call's codec.
//
// CUDA tensors whose codec has GPU kernels (topk, stc, sign, qsgd) stay on the GPU in
// builds with CUDA (residuals there too), encoded and decoded on the current stream;
// the Work's future carries the device. Other codecs copy CUDA tensors to the host and
// back.
//
// Error feedback: a worker residual per tensor (what this rank's encodes did not
// send) and, in two-phase, an owner residual for the chunk this rank owns (what its
// re-encode of the chunk's sum did not send), kept with the chunk's offset. When the
// owned chunk moves (another world size, another bucket layout, another exchange), the
// old owner residual is added to the worker residual, so it is sent next time instead
// of lost. With error feedback, a compressed step whose input holds Inf or NaN on any
// rank changes no state (residuals, counters) and returns all NaN on every rank
// (aggregate/finite_step.h): mixed precision skips it and goes on. Without, the codec
// carries the Inf or NaN into the result (majority vote and random-k, which could drop
// it, agree first like error feedback). Momentum correction (DGC, `momentum` m, with
// error feedback): the worker encodes its velocity u ← m·u + x instead of x, and, for a
// selection codec, sets u to 0 where its encode sent something (factor masking; sign
// sends every element and keeps u whole: 1-bit SGD with momentum; layer-aware, so do the
// pieces sent whole, exact); the caller's
// optimizer then runs without momentum. On the host, an fp32 all-reduce writes the next
// velocity into a spare (one more n-element buffer per tensor) in the pass that checks its
// input, and takes it once the ranks agree. State is kept under the caller's key: the
// backend derives keys from the call sequence, the DDP hook uses bucket indices or
// parameter names, the model-level API parameter names. Calls for one key must not run
// concurrently.
#pragma once

#include <map>
#include <memory>
#include <set>

#include "aggregate/exchange.h"
#include "aggregate/layer_budget.h"
#include "aggregate/piecewise_codec.h"
#include "aggregate/stateful_aggregation.h"
#include "gradzip/codec.h"

namespace gradzip {

// One tensor's state: its residuals (float32; on the CPU, or on the tensor's GPU when
// the codec has a device half; undefined until used), its calls and its encodes.
struct CompressedState {
  at::Tensor residual;        // worker residual, one per element
  at::Tensor owner_residual;  // two-phase: the owned chunk's, from element owner_offset
  at::Tensor velocity;        // momentum correction: u, one per element, where the residual lives
  int64_t owner_offset = 0;
  int level = -1;  // layers=adapt: the index of its level in the codec's levels (-1: the spec's)
  double loss_scale = 1.0;  // the loss scale the residuals and the velocity are in
  int64_t calls = 0;  // all-reduces so far, exact ones included
  uint64_t step = 0;  // compressed encodes so far: seeds the codec's random draws
  // Momentum correction on the host: the next u, written before the ranks agree to take
  // a step (velocity_into_spare); scratch, not saved.
  at::Tensor spare_velocity;
  // An exact selection without momentum on the host: u = x + residual, written in the
  // same pass (aggregate/residual_selection.h); scratch, not saved.
  at::Tensor spare_residual;
  void save(const std::string& key, std::map<std::string, at::Tensor>& out) const;
  void load(const std::string& field, const at::Tensor& value, const std::string& name);
};

class CompressedAllreduce final : public StatefulAggregation<CompressedState> {
 public:
  explicit CompressedAllreduce(const BoundSpec& spec);

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                           const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                           const std::string& key, std::optional<bool> all_finite) override;
  bool finiteness_from_caller(const at::Tensor& tensor) const override;
  c10::intrusive_ptr<c10d::Work> allreduce_pieces(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                                  const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                                  const std::vector<TensorPiece>& pieces) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(at::Tensor& output, at::Tensor& input,
                                                const c10d::ReduceScatterOptions& opts,
                                                const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                                const std::string& key) override;
  // With layers=on or adapt (CPU tensors), each piece of each chunk compressed by itself
  // (pieces under kSmallPiece elements exact); layers=adapt chooses one level per piece,
  // the same in every chunk, from its error summed over the chunks. Across nodes (the
  // hierarchical exchange), each lane chunk is a chunk of the same layout.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_pieces(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts,
                                                       const c10::intrusive_ptr<c10d::Backend>& transport,
                                                       Stats& stats, const std::string& key,
                                                       const std::vector<TensorPiece>& pieces) override;
  // With hierarchy=auto, all-reduces and compressed reduce-scatters over `transport` go
  // hierarchical when its ranks sit in several nodes of several ranks (not for vote=majority or momentum
  // correction, whose rules are per rank; they stay flat).
  void use_node_levels(const c10::intrusive_ptr<c10d::Backend>& transport, NodeLevels levels) override;
  void set_loss_scale(double scale) override;

 private:
  // A transport's node levels and the hierarchical exchanges over them, by how they
  // compress across the nodes.
  struct Hierarchy {
    c10::intrusive_ptr<c10d::Backend> transport;  // kept, so that its address names it
    NodeLevels levels;
    std::map<const ExchangeScheme*, std::unique_ptr<Exchange>> across;  // by the scheme across the nodes
  };
  // The hierarchy of `transport` when its calls may use it (mutex_ held), else null.
  const Hierarchy* hierarchy_of(const c10d::Backend& transport) const;
  // How one call goes: exact, or compressed by an exchange; with two-phase, the chunk
  // this rank owns.
  struct Plan {
    const Exchange* exchange = nullptr;  // null: exact
    Chunk owned{0, 0};                               // exchange->owned for this rank
    std::shared_ptr<const Codec> codec;  // this call's (density_warmup); null when exact
    std::vector<CodecPiece> pieces;      // layer-aware: the tensor's pieces, each with its codec; else empty
  };
  // The codec of `state`'s next compressed call: a denser one while its density warm-up
  // lasts, else the spec's.
  const std::shared_ptr<const Codec>& codec_for(const CompressedState& state) const;
  Plan plan(const at::Tensor& tensor, c10d::ReduceOp::RedOpType op, const c10d::Backend& transport,
            const CompressedState& state) const;
  // Whether a call planned `how` makes its exact selections' first pass in the pass over
  // its input before the ranks agree (aggregate/residual_selection.h): a float32 tensor
  // on the host, reduced in place, with error feedback, over a flat one-shot, by a codec
  // (top-k, STC, approx=0), or by pieces' codecs (layer-aware) of which one is.
  bool selects_in_input_pass(const at::Tensor& tensor, const Plan& how) const;
  // Whether a call of `tensor` may read it in such a pass (a plan with another exchange
  // does not): on the host with momentum correction, or where an exact selection may.
  bool reads_input_before_agreeing(const at::Tensor& tensor) const;
  // Whether a tensor of pieces is compressed piece by piece (layers=on or adapt): on the CPU.
  bool by_layers(const at::Tensor& tensor) const;
  // Each piece with its codec: `codec` (the call's; null: exact), pieces under
  // kSmallPiece elements exact, each at its level (layers=adapt, after the density
  // warm-up: the level kept under the piece's key).
  std::vector<CodecPiece> codec_pieces(const std::shared_ptr<const Codec>& codec,
                                       const std::vector<TensorPiece>& pieces) const;
  // Whether a call of a tensor of pieces compressed by `codec` (null: exact), its calls
  // so far `calls`, chooses the pieces' levels again (layers=adapt): its first compressed
  // call after the density warm-up, then every adapt_every calls.
  bool adapts(const at::Tensor& tensor, const std::shared_ptr<const Codec>& codec, int64_t calls) const;
  // The pieces' levels for what this call adds, `encoded` (`repeats` times the pieces end
  // to end: each piece's input with its momentum, level_input; a reduce-scatter's P
  // chunks), agreed by every rank of `transport` (layer_budget.h), each piece's error
  // summed over the repeats; the error tables' bytes added to `stats`; empty when some
  // rank's errors are not finite (the levels stay as they were). Communicates: mutex_
  // must not be held.
  std::vector<int> agreed_levels(const at::Tensor& encoded, const std::vector<TensorPiece>& pieces, int64_t repeats,
                                 const c10::intrusive_ptr<c10d::Backend>& transport, const EncodeContext& ctx,
                                 Stats& stats) const;
  // Sets each piece's level (kept under its key) to agreed_levels'. `lock` holds mutex_
  // on entry and exit and is released while the ranks agree.
  void agree_on_levels(const at::Tensor& encoded, const std::vector<TensorPiece>& pieces, int64_t repeats,
                       const c10::intrusive_ptr<c10d::Backend>& transport, const EncodeContext& ctx, Stats& stats,
                       std::unique_lock<std::mutex>& lock);
  // reduce_scatter with `layout` (empty: each chunk whole).
  c10::intrusive_ptr<c10d::Work> scatter(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts,
                                         const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                         const std::string& key, const std::vector<TensorPiece>& layout);
  // The all-reduce of `state`'s tensor by `plan`; `lock` holds mutex_ on entry and is
  // released before any communication. When any rank's input holds Inf or NaN, the
  // result is all NaN and `state` is left as it was (aggregate/finite_step.h); `all_finite`
  // is that answer when the caller already agreed on it (nullopt: agreed here).
  c10::intrusive_ptr<c10d::Work> run(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                     const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                     const std::string& key, std::unique_lock<std::mutex>& lock,
                                     CompressedState& state, const Plan& plan, const std::string& seed_key,
                                     std::optional<bool> all_finite);
  // Whether a reduce-scatter of `input` goes exact, and why when the user did not ask
  // for it (min_numel, warmup and one rank go exact without a warning).
  struct ExactPlan {
    bool exact = false;
    std::string warning;
  };
  ExactPlan reduce_scatter_exact(const at::Tensor& input, c10d::ReduceOp::RedOpType op, int ranks,
                                 const CompressedState& state) const;
  // Counts one compressed call of `state` (mutex_ held) and fills `call` (its x set) for
  // it: the worker residual with error feedback, the step's seed context, the scale
  // and the vote, the key.
  // The codec's random draws are seeded from `seed_key` (seed_for_key): the tensor's key,
  // or a bucket of pieces' first piece's.
  void take_step(CompressedState& state, const std::string& key, const std::string& seed_key,
                 c10d::ReduceOp::RedOpType op, const c10d::Backend& transport, ExchangeCall& call) const;
  // Brings `state`'s residuals and velocity into the current loss scale (mutex_ held).
  void follow_loss_scale(CompressedState& state) const;
  // The rounds asked for a tensor: the spec's, or automatic (0) on the CPU; one round for
  // CUDA tensors unless the spec asks, until pipelining is measured on a GPU (the device
  // path still reads each slot's length on the host).
  int64_t rounds_for(const at::Tensor& tensor) const { return rounds_ == 0 && tensor.is_cuda() ? 1 : rounds_; }

  std::shared_ptr<const Codec> codec_;
  // density_warmup: that many calls after `warmup`, in four stages of the codecs here.
  int64_t density_warmup_;
  std::vector<std::shared_ptr<const Codec>> warmup_codecs_;
  const ExchangeScheme* exchange_;  // the spec's exchange key; null: auto
  int64_t rounds_;  // the spec's `rounds` (0: exchange_rounds decides)
  bool error_feedback_;
  bool majority_;
  double momentum_;  // 0: no momentum correction
  int64_t min_numel_;
  int64_t warmup_;
  uint64_t seed_;
  // Whether calls first agree that no rank's input holds Inf or NaN: with error feedback
  // (its state must not absorb such a step), or when the codec could hide one. Without
  // either, a non-finite input reaches the result by itself, as in a dense all-reduce.
  bool agree_on_finiteness_;
  bool hierarchical_;  // the spec's hierarchy=auto, and rules that allow it
  bool layers_;        // the spec's layers=on or adapt
  bool adapt_;         // the spec's layers=adapt
  int64_t adapt_every_;
  double budget_;  // the spec's `budget`: 0, or the adapted parameters' bytes over their fp32 bytes
  CodecLevels levels_;  // layers=adapt: codec_'s levels
  std::shared_ptr<const Codec> exact_codec_;  // identity: layer-aware's small pieces
  double loss_scale_ = 1.0;  // set_loss_scale's
  std::map<const c10d::Backend*, Hierarchy> hierarchies_;
  std::set<std::string> said_exact_;  // reduce-scatter keys already logged as going exact
};

// The spec keys every compressed aggregation takes, besides its codec's.
std::vector<SpecKey> compressed_aggregation_keys();
// The rules between a compressed aggregation's keys (momentum needs error feedback),
// checked when its spec is bound.
void check_compressed_spec(const BoundSpec& spec);
// Whether a spec's aggregation reduces exactly inside nodes and compresses across them
// when its group's ranks sit in several nodes: a compressed aggregation with
// hierarchy=auto, without vote=majority or momentum correction (their rules are per rank).
bool uses_node_levels(const BoundSpec& spec);
// Whether a spec's aggregation compresses the gradzip backend's reduce_scatter_tensor
// (reduce_scatter=compressed); exact otherwise, and for aggregations without the key.
bool compresses_reduce_scatter(const BoundSpec& spec);
// Whether a spec's aggregation compresses a tensor of pieces piece by piece (its
// `layers`, auto resolved, is on or adapt); false for aggregations without the key.
bool compresses_by_layers(const BoundSpec& spec);

}  // namespace gradzip
