#include "aggregate/compressed_allreduce.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "work/completed_work.h"
#include "aggregate/exact_allreduce.h"
#include "aggregate/finite_step.h"
#include "codec/codec_record.h"
#ifdef GRADZIP_WITH_CUDA
#include "aggregate/device_codec_glue.h"
#endif

namespace gradzip {
namespace {

// A state tensor about to be used by work queued on the current stream
// (record_on_current_stream: CUDA tensors only).
const at::Tensor& used_on_current_stream(const at::Tensor& t) {
#ifdef GRADZIP_WITH_CUDA
  if (t.defined() && t.is_cuda()) record_on_current_stream(t);
#endif
  return t;
}

bool compressible(const at::Tensor& t) {
  const auto type = t.scalar_type();
  return type == at::kFloat || type == at::kHalf || type == at::kBFloat16;
}

// The state's residual as a float32 tensor of n elements on `device` (zeros at first).
at::Tensor& residual_on(CompressedState& state, const at::Device& device, int64_t n, const std::string& key) {
  if (!state.residual.defined()) state.residual = at::zeros({n}, at::dtype(at::kFloat).device(device));
  TORCH_CHECK(state.residual.numel() == n, "gradzip: the tensor keyed '", key, "' had ", state.residual.numel(),
              " elements and now has ", n, "; a key must always name a tensor of the same size");
  if (state.residual.device() != device) state.residual = state.residual.to(device);
  used_on_current_stream(state.residual);
  return state.residual;
}

// Makes the state's owner residual that of elements [owned.begin, owned.begin +
// owned.length) of its tensor (zeros when new). An owner residual of other elements goes
// back into the worker residual first (it would never be sent otherwise): the sum is
// linear, so this rank's next contribution carries it instead of its owner's. Only
// with error feedback.
void own_chunk(CompressedState& state, const Chunk& owned, const at::Device& device, int64_t n,
               const std::string& key) {
  if (state.owner_residual.defined() &&
      (state.owner_offset != owned.begin || state.owner_residual.numel() != owned.length)) {
    TORCH_CHECK(state.owner_offset >= 0 && state.owner_offset + state.owner_residual.numel() <= n,
                "gradzip: the owner residual of the tensor keyed '", key, "' covers elements ", state.owner_offset,
                " to ", state.owner_offset + state.owner_residual.numel(), " of a tensor of ", n);
    residual_on(state, device, n, key).narrow(0, state.owner_offset, state.owner_residual.numel())
        .add_(used_on_current_stream(state.owner_residual).to(device));
    state.owner_residual = at::Tensor();
  }
  if (owned.length == 0) return;
  if (!state.owner_residual.defined()) {
    state.owner_residual = at::zeros({owned.length}, at::dtype(at::kFloat).device(device));
    state.owner_offset = owned.begin;
  }
  if (state.owner_residual.device() != device) state.owner_residual = state.owner_residual.to(device);
  used_on_current_stream(state.owner_residual);
}

// The pieces' state tensors end to end. Pieces that are consecutive views of one storage,
// as the last call of the same layout left them, are viewed whole without a copy; others
// (a first call, a new bucket layout, a loaded state) are concatenated.
at::Tensor end_to_end(const std::vector<at::Tensor>& parts) {
  const at::Tensor& first = parts.front();
  bool consecutive = true;
  int64_t total = 0;
  for (const auto& part : parts) {
    consecutive = consecutive && part.dim() == 1 && part.is_contiguous() && part.device() == first.device() &&
                  part.storage().is_alias_of(first.storage()) &&
                  part.storage_offset() == first.storage_offset() + total;
    total += part.numel();
  }
  if (!consecutive) return at::cat(parts);
  at::Tensor whole = at::empty({0}, first.options());
  whole.set_(first.storage(), first.storage_offset(), {total}, {1});
  return whole;
}

// Momentum correction, before the encode: u ← m·u + x becomes what is encoded. With
// `masking` (selection codecs) the velocity is zeroed where the encode sends something
// (factor masking, mask_momentum): on the host the encoders report those positions into
// `sent` (call.ctx.sent); on a device, where they do not, this returns what the worker
// residual will hold where nothing is sent (residual + u), to find them by.
at::Tensor add_momentum(CompressedState& state, ExchangeCall& call, double momentum, const std::string& key,
                        bool masking, std::vector<int64_t>& sent) {
  const int64_t n = call.x.numel();
  if (!state.velocity.defined()) state.velocity = at::zeros({n}, call.x.options());
  TORCH_CHECK(state.velocity.numel() == n, "gradzip: the velocity of the tensor keyed '", key, "' has ",
              state.velocity.numel(), " elements, the tensor ", n);
  if (state.velocity.device() != call.x.device()) state.velocity = state.velocity.to(call.x.device());
  if (!state.velocity.is_cpu()) {
    used_on_current_stream(state.velocity).mul_(momentum).add_(call.x);
    call.x = state.velocity;
    return masking ? call.worker_residual + state.velocity : at::Tensor();
  }
  // On the host in one pass, rounded as mul_ then add_ round (no FMA: the build targets
  // x86-64 without it).
  if (!state.velocity.is_contiguous()) state.velocity = state.velocity.contiguous();  // as loaded
  TORCH_INTERNAL_ASSERT(call.x.is_contiguous() && call.x.scalar_type() == at::kFloat &&
                        state.velocity.scalar_type() == at::kFloat);
  float* u = state.velocity.data_ptr<float>();
  const float* x = call.x.data_ptr<float>();
  const float m = static_cast<float>(momentum);
  for (int64_t i = 0; i < n; ++i) u[i] = u[i] * m + x[i];
  call.x = state.velocity;
  if (masking) call.ctx.sent = &sent;
  return at::Tensor();
}

// Factor masking, after the encode: u is zeroed where the encode sent something. On the
// host at the positions the encoders reported: a tensor of pieces (layer-aware) reports
// only from the pieces whose codec selects, so a piece sent whole (a small one, exact)
// keeps u, as momentum SGD's buffer, where masking would reset it every step and leave
// that parameter no momentum at all. On a device (one codec, which selects) where the
// residual no longer holds residual + u (`unsent`).
void mask_momentum(CompressedState& state, const ExchangeCall& call, const at::Tensor& unsent,
                   const std::vector<int64_t>& sent) {
  if (!state.velocity.is_cpu()) {
    state.velocity.masked_fill_(call.worker_residual.ne(unsent), 0.0);
    return;
  }
  float* u = state.velocity.data_ptr<float>();
  const int64_t n = state.velocity.numel();
  for (const int64_t i : sent) {
    TORCH_INTERNAL_ASSERT(i >= 0 && i < n, "gradzip: an encoder reported position ", i, " of ", n);
    u[i] = 0.0f;
  }
}

// What a choice of levels measures the levels' errors on (layers=adapt): what this call
// adds to the tensor's encoded input (into the velocity with momentum correction),
// float32, flat; not the residual, which follows the level chosen last (layer_budget.h).
at::Tensor level_input(const at::Tensor& tensor, const CompressedState& state, double momentum) {
  at::Tensor input = tensor.detach().reshape({-1}).to(at::kFloat);
  if (state.velocity.defined()) input = state.velocity * momentum + input;
  return input;
}

// The spec's `layers`, auto resolved: adapt for the codecs with levels (top-k, random-k,
// STC, QSGD), on for those that ask for it (sign: its block scales within each
// parameter), off for the rest (the casts, whose small pieces would go as fp32; the
// error-bounded codecs, uniform, polar).
std::string layers_of(const BoundSpec& spec) {
  const std::string layers = spec.spec().get_string("layers");
  if (layers != "auto") return layers;
  if (has_levels(*spec.codec())) return "adapt";
  return spec.codec()->per_parameter_by_default() ? "on" : "off";
}

}  // namespace

void check_compressed_spec(const BoundSpec& spec) {
  if (spec.spec().get_double("momentum", 0.0) > 0 && !spec.error_feedback()) {
    throw SpecError("gradzip: spec '" + spec.str() +
                    "': momentum correction keeps what was not sent in the residual; it needs ef=1");
  }
  if (layers_of(spec) == "adapt" && !has_levels(*spec.codec())) {
    throw SpecError("gradzip: spec '" + spec.str() + "': layers=adapt chooses each layer's density (topk, randomk, " +
                    "stc) or levels (qsgd); codec '" + spec.codec()->name() + "' has neither");
  }
  if (spec.spec().get_double("budget") > 0 && layers_of(spec) != "adapt") {
    throw SpecError("gradzip: spec '" + spec.str() + "': budget sets the bytes layers=adapt chooses levels under; " +
                    "this spec's layers is " + layers_of(spec));
  }
}

namespace {

bool takes_key(const BoundSpec& spec, const char* name) {
  const auto& keys = spec.kind().keys;
  return std::any_of(keys.begin(), keys.end(), [&](const SpecKey& k) { return k.name == name; });
}

}  // namespace

bool uses_node_levels(const BoundSpec& spec) {
  return takes_key(spec, "hierarchy") && spec.spec().get_string("hierarchy") == "auto" &&
         !spec.codec()->votes() && spec.spec().get_double("momentum", 0.0) == 0;
}

bool compresses_by_layers(const BoundSpec& spec) { return takes_key(spec, "layers") && layers_of(spec) != "off"; }

bool compresses_reduce_scatter(const BoundSpec& spec) {
  return takes_key(spec, "reduce_scatter") && spec.spec().get_string("reduce_scatter") == "compressed";
}

std::vector<SpecKey> compressed_aggregation_keys() {
  return {SpecKey::boolean("ef", "",
                           "error feedback: add what earlier steps did not send, keep what this step does not send "
                           "(default: on for topk, stc, sign with vote=mean; off otherwise)"),
          SpecKey::choice("exchange", "auto", {"auto", "oneshot", "twophase"},
                          "how payloads travel: oneshot (all-gather), twophase (all-to-all of chunks, owners "
                          "reduce and re-encode, all-gather), auto (the fewest bytes, dense when compression "
                          "would send more than a ring; twophase only for identity, fp16 and bf16: it compresses twice)"),
          SpecKey::choice("layers", "auto", {"auto", "off", "on", "adapt"},
                          "on a tensor made of named parameters (the DDP hook with model=, the FSDP door's "
                          "shards): on compresses each parameter by itself (top-k's selection, sign's blocks, "
                          "QSGD's buckets within it) and sends parameters under 1024 elements exact (CPU tensors); adapt as on, each parameter "
                          "at the density (levels) of ×1/8..×8 the spec's that minimises the bucket's compression "
                          "error within the bytes of the spec's everywhere, agreed by all ranks every adapt_every "
                          "calls; off: the bucket as one tensor; auto: adapt for topk, randomk, stc and qsgd, on "
                          "for sign, off for the rest"),
          SpecKey::integer("adapt_every", "100", 1, 9.2e18,
                           "layers=adapt: calls of a bucket between two choices of its parameters' levels"),
          SpecKey::number("budget", "0", 0.0, 1.0,
                          "layers=adapt: the bytes the adapted parameters may send, as a fraction of their fp32 "
                          "bytes (0.01: 1%); the levels may then all move away from the spec's (0: the bytes of "
                          "the spec's level everywhere)"),
          SpecKey::choice("hierarchy", "auto", {"auto", "off"},
                          "over ranks in several nodes of several ranks each (gradzip.node_layout): auto reduces "
                          "exactly inside each node and compresses only across the nodes, each local rank one "
                          "shard (not with vote=majority or momentum); off: every rank a peer"),
          SpecKey::integer("rounds", "0", 0, kMaxRounds * 8,
                           "two-phase and compressed reduce-scatter in this many pipelined rounds, each chunk cut "
                           "into as many sub-pieces: the transport moves one round while the next is encoded "
                           "(0: one round per 4 MiB a rank sends in the first phase, at most 8)"),
          SpecKey::choice("reduce_scatter", "exact", {"exact", "compressed"},
                          "the gradzip backend's reduce_scatter_tensor (FSDP's gradients): exact, or compressed "
                          "with this codec and error feedback like all_reduce"),
          SpecKey::integer("min_numel", "0", 0, 9.2e18, "tensors with fewer elements go exact"),
          SpecKey::integer("warmup", "0", 0, 9.2e18, "the first warmup calls of each tensor (all-reduces, reduce-scatters) go exact"),
          SpecKey::integer("seed", "0", 0, 9.2e18,
                           "seeds random-k's choice and QSGD's stochastic rounding (with the step and the rank)")};
}

void CompressedState::save(const std::string& key, std::map<std::string, at::Tensor>& out) const {
  if (residual.defined()) out[state_name(key, "residual")] = residual.to(at::kCPU).clone();
  if (velocity.defined()) out[state_name(key, "velocity")] = velocity.to(at::kCPU).clone();
  if (owner_residual.defined()) {
    out[state_name(key, "owner_residual")] = owner_residual.to(at::kCPU).clone();
    out[state_name(key, "owner_offset")] = count_tensor(owner_offset);
  }
  if (level >= 0) out[state_name(key, "level")] = count_tensor(level);
  if (loss_scale != 1.0) out[state_name(key, "loss_scale")] = at::scalar_tensor(loss_scale, at::kDouble);
  if (calls == 0 && step == 0 && level >= 0) return;  // a reduce-scatter piece's level, nothing else
  out[state_name(key, "calls")] = count_tensor(calls);
  out[state_name(key, "step")] = count_tensor(static_cast<int64_t>(step));
}

void CompressedState::load(const std::string& field, const at::Tensor& value, const std::string& name) {
  if (field == "residual") {
    residual = float_state(value, name);
  } else if (field == "velocity") {
    velocity = float_state(value, name);
  } else if (field == "owner_residual") {
    owner_residual = float_state(value, name);
  } else if (field == "owner_offset") {
    owner_offset = count_of(value, name);
  } else if (field == "level") {
    const int64_t value_level = count_of(value, name);
    TORCH_CHECK(value_level < kMaxLevels, "gradzip: state entry '", name, "' holds level ", value_level,
                "; a codec has at most ", kMaxLevels, " levels");
    level = static_cast<int>(value_level);
  } else if (field == "loss_scale") {
    TORCH_CHECK(value.numel() == 1 && value.is_floating_point(), "gradzip: state entry '", name,
                "' must hold one floating-point number");
    loss_scale = value.item<double>();
    TORCH_CHECK(std::isfinite(loss_scale) && loss_scale > 0, "gradzip: state entry '", name,
                "' holds a loss scale of ", loss_scale, "; it must be finite and above 0");
  } else if (field == "calls") {
    calls = count_of(value, name);
  } else if (field == "step") {
    step = static_cast<uint64_t>(count_of(value, name));
  } else {
    unknown_state_field(name);
  }
}

CompressedAllreduce::CompressedAllreduce(const BoundSpec& spec)
    : StatefulAggregation(spec),
      codec_(spec.codec()),
      density_warmup_(spec.spec().get_int("density_warmup", 0)),  // 0: a codec without the key (no density)
      exchange_(exchange_request(spec.spec())),
      rounds_(rounds_request(spec.spec())),
      error_feedback_(spec.error_feedback()),
      majority_(codec_->votes()),
      momentum_(spec.spec().get_double("momentum", 0.0)),
      min_numel_(spec.spec().get_int("min_numel")),
      warmup_(spec.spec().get_int("warmup")),
      seed_(static_cast<uint64_t>(spec.spec().get_int("seed"))),
      agree_on_finiteness_(error_feedback_ || !codec_->carries_non_finite()),
      hierarchical_(uses_node_levels(spec)),
      layers_(layers_of(spec) != "off"),
      adapt_(layers_of(spec) == "adapt"),
      adapt_every_(spec.spec().get_int("adapt_every")),
      budget_(spec.spec().get_double("budget")),
      levels_(adapt_ ? codec_levels(codec_) : CodecLevels{}),
      exact_codec_(make_codec(parse_spec("identity"))) {
  if (density_warmup_ == 0) return;
  constexpr int kStages = 4;
  const double density = codec_->budget().value;
  for (int stage = 0; stage < kStages; ++stage) {
    const double denser = std::max(density, 0.25 / std::pow(4.0, stage));
    warmup_codecs_.push_back(denser == density ? codec_ : codec_->with_budget(denser));
  }
}

const std::shared_ptr<const Codec>& CompressedAllreduce::codec_for(const CompressedState& state) const {
  const int64_t call = state.calls - warmup_;
  if (call < 0 || call >= density_warmup_) return codec_;
  const auto stages = static_cast<int64_t>(warmup_codecs_.size());
  return warmup_codecs_[static_cast<size_t>(call * stages / density_warmup_)];
}

void CompressedAllreduce::take_step(CompressedState& state, const std::string& key, const std::string& seed_key,
                                    c10d::ReduceOp::RedOpType op, const c10d::Backend& transport,
                                    ExchangeCall& call) const {
  ++state.calls;
  if (error_feedback_) call.worker_residual = residual_on(state, call.x.device(), call.x.numel(), key);
  call.ctx = {seed_for_key(seed_, seed_key), state.step++, static_cast<uint32_t>(transport.getRank())};
  call.majority = majority_;
  if (!majority_ && op == c10d::ReduceOp::AVG) call.scale = 1.0f / static_cast<float>(transport.getSize());
  call.key = &key;
}

CompressedAllreduce::Plan CompressedAllreduce::plan(const at::Tensor& tensor, c10d::ReduceOp::RedOpType op,
                                                   const c10d::Backend& transport,
                                                   const CompressedState& state) const {
  const bool supported_op = op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG;
  const int64_t n = tensor.numel();
  if (!compressible(tensor) || !supported_op || n < min_numel_ || state.calls < warmup_) return {};
  const int ranks = transport.getSize();
  Plan plan;
  plan.codec = codec_for(state);
  if (const Hierarchy* hierarchy = hierarchy_of(transport)) {
    // Across the nodes, the scheme auto would take for a shard among the nodes.
    const int64_t shard = exchange_chunk(n, hierarchy->levels.node->getSize(), 0).length;
    const ExchangeScheme across = choose_exchange_for(
        *plan.codec, exchange_,
        exchange_cost(*plan.codec, shard, tensor.element_size(), hierarchy->levels.lane->getSize(),
                      lane_rounds(*plan.codec, shard, hierarchy->levels, rounds_for(tensor))));
    if (across == ExchangeScheme::kDense) return {};
    plan.scheme = ExchangeScheme::kHierarchical;
    plan.exchange = across == ExchangeScheme::kOneShot ? hierarchy->oneshot_across.get()
                                                       : hierarchy->twophase_across.get();
  } else {
    plan.scheme = choose_exchange_for(*plan.codec, exchange_,
                                      exchange_cost(*plan.codec, n, tensor.element_size(), ranks, rounds_for(tensor)));
    if (plan.scheme == ExchangeScheme::kDense) return {};
    plan.exchange = &exchange_of(plan.scheme);
  }
  plan.owned = plan.exchange->owned(n, ranks, transport.getRank());
  return plan;
}

bool CompressedAllreduce::by_layers(const at::Tensor& tensor) const {
  return layers_ && tensor.is_cpu();
}

std::vector<CodecPiece> CompressedAllreduce::codec_pieces(const std::shared_ptr<const Codec>& codec,
                                                          const std::vector<TensorPiece>& pieces) const {
  std::vector<CodecPiece> out;
  if (!codec) return out;  // exact
  const bool leveled = adapt_ && codec == codec_;
  for (const auto& piece : pieces) {
    std::shared_ptr<const Codec> chosen = codec;
    if (piece.numel < kSmallPiece) {
      chosen = exact_codec_;
    } else if (leveled) {
      const auto found = states_.find(piece.key);
      const int level = found == states_.end() ? -1 : found->second.level;
      TORCH_CHECK(level < static_cast<int>(levels_.codecs.size()), "gradzip: the state of '", piece.key,
                  "' holds level ", level, "; this spec's codec has ", levels_.codecs.size());
      if (level >= 0) chosen = levels_.codecs[static_cast<size_t>(level)];
    }
    out.push_back({piece.numel, std::move(chosen)});
  }
  return out;
}

bool CompressedAllreduce::adapts(const at::Tensor& tensor, const std::shared_ptr<const Codec>& codec,
                                 int64_t calls) const {
  if (!adapt_ || !by_layers(tensor) || !codec || codec != codec_) return false;
  const int64_t since = calls - warmup_ - density_warmup_;
  return since >= 0 && since % adapt_every_ == 0;
}

std::vector<int> CompressedAllreduce::agreed_levels(const at::Tensor& encoded, const std::vector<TensorPiece>& pieces,
                                                    int64_t repeats,
                                                    const c10::intrusive_ptr<c10d::Backend>& transport,
                                                    const EncodeContext& ctx, Stats& stats) const {
  const auto count = static_cast<int64_t>(levels_.codecs.size());
  std::vector<size_t> large;  // the pieces that are compressed (the small ones go exact)
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].numel >= kSmallPiece) {
      large.push_back(i);
      offsets.push_back(offset);
    }
    offset += pieces[i].numel;
  }
  const int64_t stride = offset;  // one repeat's elements
  TORCH_CHECK(encoded.numel() == repeats * stride, "gradzip: ", repeats, " repeats of pieces of ", stride,
              " elements are not the ", encoded.numel(), " encoded");
  at::Tensor table = at::zeros({static_cast<int64_t>(large.size()), count}, at::kDouble);
  for (int64_t r = 0; r < repeats; ++r) {
    for (size_t j = 0; j < large.size(); ++j) {
      const at::Tensor part = encoded.narrow(0, r * stride + offsets[j], pieces[large[j]].numel).contiguous();
      const auto errors = level_errors(levels_, part, piece_context(ctx, r * pieces.size() + large[j]));
      for (int64_t l = 0; l < count; ++l) table[static_cast<int64_t>(j)][l] += errors[static_cast<size_t>(l)];
    }
  }
  table = summed_in_rank_order(table, transport);
  const int64_t others = transport->getSize() - 1;
  stats.add_traffic(others * table.numel() * 8, others * table.numel() * 8);
  if (!at::isfinite(table).all().item<bool>()) return {};
  std::vector<std::vector<double>> error(large.size());
  std::vector<std::vector<int64_t>> bytes(large.size());
  const double* e = table.data_ptr<double>();
  for (size_t j = 0; j < large.size(); ++j) {
    for (int64_t l = 0; l < count; ++l) {
      error[j].push_back(e[static_cast<int64_t>(j) * count + l]);
      bytes[j].push_back(repeats * slot_bytes(*levels_.codecs[static_cast<size_t>(l)], pieces[large[j]].numel));
    }
  }
  int64_t budget = -1;  // the bytes of the spec's level everywhere
  if (budget_ > 0) {
    int64_t numel = 0;
    for (size_t i : large) numel += pieces[i].numel;
    budget = static_cast<int64_t>(std::floor(budget_ * 4.0 * static_cast<double>(repeats * numel)));
  }
  const std::vector<int> chosen = choose_levels(error, bytes, levels_.base, budget);
  std::vector<int> levels(pieces.size(), -1);
  for (size_t j = 0; j < large.size(); ++j) levels[large[j]] = chosen[j];
  return levels;
}

void CompressedAllreduce::agree_on_levels(const at::Tensor& encoded, const std::vector<TensorPiece>& pieces,
                                          int64_t repeats, const c10::intrusive_ptr<c10d::Backend>& transport,
                                          const EncodeContext& ctx, Stats& stats,
                                          std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  const std::vector<int> levels = agreed_levels(encoded.contiguous(), pieces, repeats, transport, ctx, stats);
  lock.lock();
  for (size_t i = 0; i < levels.size(); ++i) {
    // A piece without a state of its own (a reduce-scatter's) gets one only for a level.
    const auto found = states_.find(pieces[i].key);
    if (found != states_.end()) {
      found->second.level = levels[i];
    } else if (levels[i] >= 0) {
      states_[pieces[i].key].level = levels[i];
    }
  }
}

void CompressedAllreduce::use_node_levels(const c10::intrusive_ptr<c10d::Backend>& transport, NodeLevels levels) {
  TORCH_CHECK(levels.node && levels.lane && levels.node->getSize() * levels.lane->getSize() == transport->getSize(),
              "gradzip: node levels must split the transport's ", transport->getSize(), " ranks into nodes of equal size");
  std::lock_guard<std::mutex> lock(mutex_);
  Hierarchy& hierarchy = hierarchies_[transport.get()];
  hierarchy.transport = transport;
  hierarchy.oneshot_across = hierarchical_exchange(levels, oneshot_exchange());
  hierarchy.twophase_across = hierarchical_exchange(levels, twophase_exchange());
  hierarchy.levels = std::move(levels);
}

void CompressedAllreduce::set_loss_scale(double scale) {
  TORCH_CHECK(std::isfinite(scale) && scale > 0, "gradzip: a loss scale must be finite and above 0, got ", scale);
  std::lock_guard<std::mutex> lock(mutex_);
  loss_scale_ = scale;
}

void CompressedAllreduce::follow_loss_scale(CompressedState& state) const {
  if (state.loss_scale == loss_scale_) return;
  const double ratio = loss_scale_ / state.loss_scale;
  for (at::Tensor* t : {&state.residual, &state.owner_residual, &state.velocity}) {
    if (t->defined()) used_on_current_stream(*t).mul_(ratio);
  }
  state.loss_scale = loss_scale_;
}

const CompressedAllreduce::Hierarchy* CompressedAllreduce::hierarchy_of(const c10d::Backend& transport) const {
  if (!hierarchical_) return nullptr;
  const auto found = hierarchies_.find(&transport);
  if (found == hierarchies_.end()) return nullptr;
  const NodeLevels& levels = found->second.levels;
  return levels.node->getSize() > 1 && levels.lane->getSize() > 1 ? &found->second : nullptr;
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts,
                                                              const c10::intrusive_ptr<c10d::Backend>& transport,
                                                              Stats& stats, const std::string& key,
                                                              std::optional<bool> all_finite) {
  TORCH_CHECK(tensors.size() == 1, "gradzip: all_reduce takes one tensor, got ", tensors.size());
  std::unique_lock<std::mutex> lock(mutex_);
  CompressedState& state = states_[key];
  follow_loss_scale(state);
  const Plan how = plan(tensors.front(), opts.reduceOp.op_, *transport, state);
  if (error_feedback_ && how.scheme != ExchangeScheme::kDense) {
    own_chunk(state, how.owned, codec_device(*codec_, tensors.front()), tensors.front().numel(), key);
  }
  return run(tensors, opts, transport, stats, key, lock, state, how, key, all_finite);
}

bool CompressedAllreduce::agrees_on_finiteness(const at::Tensor& tensor) const {
  return agree_on_finiteness_ && compressible(tensor);
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::allreduce_pieces(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceOptions& opts,
                                                                     const c10::intrusive_ptr<c10d::Backend>& transport,
                                                                     Stats& stats,
                                                                     const std::vector<TensorPiece>& pieces) {
  TORCH_CHECK(tensors.size() == 1 && !pieces.empty(), "gradzip: all_reduce of pieces takes one tensor and its pieces");
  int64_t total = 0;
  for (const auto& piece : pieces) total += piece.numel;
  TORCH_CHECK(total == tensors.front().numel(), "gradzip: the pieces hold ", total, " elements, the tensor ",
              tensors.front().numel());
  const at::Device device = codec_device(*codec_, tensors.front());
  std::unique_lock<std::mutex> lock(mutex_);
  // One state for the whole tensor, assembled from the pieces' and returned to them as
  // views of it (so the next call of the same layout assembles nothing): the worker
  // residuals end to end, and the owner residuals of the pieces' parts of the owned
  // chunk, which tile it.
  for (const auto& piece : pieces) follow_loss_scale(states_[piece.key]);
  const CompressedState& first = states_[pieces.front().key];
  CompressedState whole{at::Tensor(), at::Tensor(), at::Tensor(), 0, -1, loss_scale_, first.calls, first.step};
  Plan how = plan(tensors.front(), opts.reduceOp.op_, *transport, whole);
  const bool keep = error_feedback_ && how.scheme != ExchangeScheme::kDense;
  const auto part_of_chunk = [&](int64_t offset, int64_t numel) {
    const int64_t begin = std::clamp(how.owned.begin, offset, offset + numel);
    const int64_t end = std::clamp(how.owned.begin + how.owned.length, offset, offset + numel);
    return Chunk{begin - offset, end - begin};
  };
  if (keep) {
    std::vector<at::Tensor> parts, owned_parts, velocities;
    int64_t offset = 0;
    for (const auto& piece : pieces) {
      CompressedState& state = states_[piece.key];
      own_chunk(state, part_of_chunk(offset, piece.numel), device, piece.numel, piece.key);
      parts.push_back(residual_on(state, device, piece.numel, piece.key));
      if (state.owner_residual.defined()) owned_parts.push_back(state.owner_residual);
      if (momentum_ > 0) {
        velocities.push_back(state.velocity.defined() ? state.velocity.to(device)
                                                      : at::zeros({piece.numel}, at::dtype(at::kFloat).device(device)));
      }
      offset += piece.numel;
    }
    whole.residual = end_to_end(parts);
    if (!velocities.empty()) whole.velocity = end_to_end(velocities);
    if (!owned_parts.empty()) {
      whole.owner_residual = end_to_end(owned_parts);
      whole.owner_offset = how.owned.begin;
    }
  }
  if (adapts(tensors.front(), how.codec, whole.calls)) {
    const EncodeContext ctx{seed_for_key(seed_, pieces.front().key + ":levels"), whole.step,
                            static_cast<uint32_t>(transport->getRank())};
    agree_on_levels(level_input(tensors.front(), whole, momentum_), pieces, 1, transport, ctx, stats, lock);
  }
  if (by_layers(tensors.front())) how.pieces = codec_pieces(how.codec, pieces);
  const std::string key = pieces.front().key + " (and the rest of its bucket)";
  auto work = run(tensors, opts, transport, stats, key, lock, whole, how, pieces.front().key, std::nullopt);
  lock.lock();
  int64_t offset = 0;
  for (const auto& piece : pieces) {
    CompressedState& state = states_[piece.key];
    state.calls = whole.calls;
    state.step = whole.step;
    state.loss_scale = whole.loss_scale;
    if (keep) {
      state.residual = whole.residual.narrow(0, offset, piece.numel);
      if (whole.velocity.defined()) state.velocity = whole.velocity.narrow(0, offset, piece.numel);
      const Chunk part = part_of_chunk(offset, piece.numel);
      if (part.length > 0) {
        state.owner_residual = whole.owner_residual.narrow(0, offset + part.begin - how.owned.begin, part.length);
      }
    }
    offset += piece.numel;
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::run(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts,
                                                        const c10::intrusive_ptr<c10d::Backend>& transport,
                                                        Stats& stats, const std::string& key,
                                                        std::unique_lock<std::mutex>& lock, CompressedState& state,
                                                        const Plan& how, const std::string& seed_key,
                                                        std::optional<bool> all_finite) {
  at::Tensor& tensor = tensors.front();
  if (how.scheme == ExchangeScheme::kDense) {
    ++state.calls;
    lock.unlock();
    return exact_allreduce(tensors, opts, transport, stats);
  }
  const int64_t n = tensor.numel();
  const int ranks = transport->getSize();
  const at::Device device = codec_device(*codec_, tensor);
  ExchangeCall call;
  call.x = tensor.detach().reshape({n}).to(device, at::kFloat).contiguous();  // the exchanges cut it in chunks
  lock.unlock();
  if (agree_on_finiteness_ && !(all_finite ? *all_finite : finite_on_every_rank(call.x, transport, tensor.device()))) {
    tensor.fill_(std::numeric_limits<float>::quiet_NaN());
    return completed_work(tensors);
  }
  lock.lock();
  take_step(state, key, seed_key, opts.reduceOp.op_, *transport, call);
  if (error_feedback_ && how.owned.length > 0) call.owner_residual = state.owner_residual;
  call.transport_device = tensor.device();
  call.rounds = rounds_for(tensor);
  const bool masking = momentum_ > 0 && how.codec->selects();
  std::vector<int64_t> sent_positions;
  const at::Tensor unsent =
      momentum_ > 0 ? add_momentum(state, call, momentum_, key, masking, sent_positions) : at::Tensor();
  TORCH_INTERNAL_ASSERT(!unsent.defined() || how.pieces.empty(), "gradzip: layer-aware momentum masking runs on the host");
  lock.unlock();

  const c10::OptionalDeviceGuard guard(device.is_cuda() ? std::optional<at::Device>(device) : std::nullopt);
  // An fp32 tensor on the codec's device is its own sum (the encoder reads it before
  // anything is written): no 4n-byte buffer and no pass to copy it back.
  const bool in_place = tensor.device() == device && tensor.scalar_type() == at::kFloat && tensor.is_contiguous();
  at::Tensor sum = in_place ? tensor.view({n}) : at::empty({n}, at::dtype(at::kFloat).device(device));
  const auto codec = how.pieces.empty() ? tensor_codec(how.codec, device) : piecewise_codec(how.pieces);
  const int64_t sent = how.exchange->allreduce(*codec, *how.codec, call, sum, transport);
  if (masking) mask_momentum(state, call, unsent, sent_positions);
  if (majority_) sum.sign_();
  if (!in_place) tensor.copy_(sum.view(tensor.sizes()));
  stats.add(sent, sent, ring_allreduce_bytes(n * 4, ranks));
  return completed_work(tensors);
}

CompressedAllreduce::ExactPlan CompressedAllreduce::reduce_scatter_exact(const at::Tensor& input,
                                                                        c10d::ReduceOp::RedOpType op, int ranks,
                                                                        const CompressedState& state) const {
  if (!compressible(input)) return {true, "its dtype is " + std::string(c10::toString(input.scalar_type()))};
  if (op != c10d::ReduceOp::SUM && op != c10d::ReduceOp::AVG) {
    return {true, "its reduce op (c10d RedOpType " + std::to_string(static_cast<int>(op)) + ") is not SUM or AVG"};
  }
  if (ranks == 1 || input.numel() < min_numel_ || state.calls < warmup_) return {true, ""};
  const ReduceScatterCost cost = reduce_scatter_cost(*codec_for(state), input.numel(), input.element_size(), ranks,
                                                     rounds_for(input));
  if (exchange_ == ExchangeRequest::kAuto && cost.compressed >= cost.dense) {
    return {true, "compressed it would send " + std::to_string(cost.compressed) + " bytes per rank, the transport's " +
                      std::to_string(cost.dense)};
  }
  return {};
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::reduce_scatter(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::ReduceScatterOptions& opts,
                                                                   const c10::intrusive_ptr<c10d::Backend>& transport,
                                                                   Stats& stats, const std::string& key) {
  return scatter(output, input, opts, transport, stats, key, {});
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::reduce_scatter_pieces(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts,
    const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats, const std::string& key,
    const std::vector<TensorPiece>& pieces) {
  int64_t total = 0;
  for (const auto& piece : pieces) {
    TORCH_CHECK(piece.numel > 0, "gradzip: reduce_scatter's piece '", piece.key, "' has ", piece.numel,
                " elements; a piece needs at least 1");
    total += piece.numel;
  }
  TORCH_CHECK(total == output.numel(), "gradzip: reduce_scatter's pieces hold ", total,
              " elements, each rank's chunk (the output) ", output.numel());
  std::vector<TensorPiece> layout;  // each piece's choices kept under "<key>/<piece key>"
  for (const auto& piece : pieces) layout.push_back({key + "/" + piece.key, piece.numel});
  return scatter(output, input, opts, transport, stats, key, layout);
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::scatter(at::Tensor& output, at::Tensor& input,
                                                            const c10d::ReduceScatterOptions& opts,
                                                            const c10::intrusive_ptr<c10d::Backend>& transport,
                                                            Stats& stats, const std::string& key,
                                                            const std::vector<TensorPiece>& layout) {
  check_reduce_scatter(output, input, *transport);
  const int ranks = transport->getSize();
  const int64_t n = input.numel();
  std::unique_lock<std::mutex> lock(mutex_);
  CompressedState& state = states_[key];
  follow_loss_scale(state);
  const ExactPlan exact = reduce_scatter_exact(input, opts.reduceOp.op_, ranks, state);
  if (exact.exact) {
    ++state.calls;
    if (!exact.warning.empty() && said_exact_.insert(key).second) {
      TORCH_WARN("gradzip: the reduce-scatter of the tensor keyed '", key, "' goes exact (", codec_->name(),
                 " not used): ", exact.warning);
    }
    lock.unlock();
    return exact_reduce_scatter(output, input, opts, transport, stats);
  }
  const at::Device device = codec_device(*codec_, input);
  const std::shared_ptr<const Codec> codec = codec_for(state);
  ExchangeCall call;
  call.x = input.detach().reshape({n}).to(device, at::kFloat).contiguous();
  const Hierarchy* hierarchy = hierarchy_of(*transport);
  lock.unlock();
  std::vector<at::Tensor> outputs = {output};
  if (agree_on_finiteness_ && !finite_on_every_rank(call.x, transport, input.device())) {
    output.fill_(std::numeric_limits<float>::quiet_NaN());
    return completed_work(outputs);
  }
  lock.lock();
  const bool by_pieces = !layout.empty() && by_layers(input);
  if (by_pieces && adapts(input, codec, state.calls)) {
    const EncodeContext ctx{seed_for_key(seed_, key + ":levels"), state.step,
                            static_cast<uint32_t>(transport->getRank())};
    agree_on_levels(level_input(call.x, state, momentum_), layout, ranks, transport, ctx, stats, lock);
  }
  take_step(state, key, key, opts.reduceOp.op_, *transport, call);
  call.transport_device = input.device();
  call.rounds = rounds_for(input);
  // Layer-aware: the layout's pieces in every chunk the compressed exchange sees (the
  // ranks', or across nodes the lane's), each piece at the same codec in every chunk.
  std::vector<CodecPiece> pieces;
  if (by_pieces) {
    const std::vector<CodecPiece> chunk = codec_pieces(codec, layout);
    const int chunks = hierarchy ? hierarchy->levels.lane->getSize() : ranks;
    for (int c = 0; c < chunks; ++c) pieces.insert(pieces.end(), chunk.begin(), chunk.end());
  }
  const bool masking = momentum_ > 0 && codec_->selects();
  std::vector<int64_t> sent_positions;
  const at::Tensor unsent =
      momentum_ > 0 ? add_momentum(state, call, momentum_, key, masking, sent_positions) : at::Tensor();
  TORCH_INTERNAL_ASSERT(momentum_ == 0 || !hierarchy, "gradzip: momentum correction stays flat");
  TORCH_INTERNAL_ASSERT(!unsent.defined() || pieces.empty(), "gradzip: layer-aware momentum masking runs on the host");
  lock.unlock();

  const c10::OptionalDeviceGuard guard(device.is_cuda() ? std::optional<at::Device>(device) : std::nullopt);
  at::Tensor shard = at::empty({output.numel()}, at::dtype(at::kFloat).device(device));
  const auto tensor = pieces.empty() ? tensor_codec(codec, device) : piecewise_codec(std::move(pieces));
  const int64_t sent = hierarchy ? hierarchical_reduce_scatter(hierarchy->levels, *tensor, *codec, call, shard, transport)
                                 : compressed_reduce_scatter(*tensor, *codec, call, shard, transport);
  if (masking) mask_momentum(state, call, unsent, sent_positions);
  if (majority_) shard.sign_();
  output.copy_(shard.view(output.sizes()));
  stats.add(sent, sent, (ranks - 1) * output.numel() * 4);
  return completed_work(outputs);
}

}  // namespace gradzip
