// The call's plan: the spec bound into a CompressedAllreduce, and, for each call, how it
// goes from its tensor, op, transport and state: exact or compressed, with which codec
// (density warm-up), by which exchange (one-shot, two-phase, or hierarchical across the
// nodes of use_node_levels), and the chunk this rank owns; a reduce-scatter's exact choice.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "aggregate/compressed_allreduce.h"
#include "aggregate/compressed_spec_keys.h"
#include "codec/codec_record.h"
#include "codec/selection_codec.h"

namespace gradzip {
namespace {

bool compressible(const at::Tensor& t) {
  const auto type = t.scalar_type();
  return type == at::kFloat || type == at::kHalf || type == at::kBFloat16;
}

}  // namespace

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
    const ExchangeScheme* across = choose_exchange_for(
        *plan.codec, exchange_,
        exchange_cost(*plan.codec, shard, tensor.element_size(), hierarchy->levels.lane->getSize(),
                      lane_rounds(*plan.codec, shard, hierarchy->levels, rounds_for(tensor))));
    if (!across) return {};
    plan.exchange = hierarchy->across.at(across).get();
  } else {
    const ExchangeScheme* scheme = choose_exchange_for(
        *plan.codec, exchange_, exchange_cost(*plan.codec, n, tensor.element_size(), ranks, rounds_for(tensor)));
    if (!scheme) return {};
    plan.exchange = &scheme->exchange();
  }
  plan.owned = plan.exchange->owned(n, ranks, transport.getRank());
  return plan;
}

const CompressedAllreduce::Hierarchy* CompressedAllreduce::hierarchy_of(const c10d::Backend& transport) const {
  if (!hierarchical_) return nullptr;
  const auto found = hierarchies_.find(&transport);
  if (found == hierarchies_.end()) return nullptr;
  const NodeLevels& levels = found->second.levels;
  return levels.node->getSize() > 1 && levels.lane->getSize() > 1 ? &found->second : nullptr;
}

void CompressedAllreduce::use_node_levels(const c10::intrusive_ptr<c10d::Backend>& transport, NodeLevels levels) {
  TORCH_CHECK(levels.node && levels.lane && levels.node->getSize() * levels.lane->getSize() == transport->getSize(),
              "gradzip: node levels must split the transport's ", transport->getSize(), " ranks into nodes of equal size");
  std::lock_guard<std::mutex> lock(mutex_);
  Hierarchy& hierarchy = hierarchies_[transport.get()];
  hierarchy.transport = transport;
  for (const ExchangeScheme* scheme : exchange_schemes()) hierarchy.across[scheme] = hierarchical_exchange(levels, *scheme);
  hierarchy.levels = std::move(levels);
}

// Below this many elements the caller's read of the input for its flag costs less than
// an exchange of the aggregation's own (0.1–0.3 ms on loopback at 2–4 ranks, against 4
// bytes per element at about 20 GB/s).
constexpr int64_t kFlagReadBelow = int64_t{1} << 20;

bool CompressedAllreduce::finiteness_from_caller(const at::Tensor& tensor) const {
  return agree_on_finiteness_ && compressible(tensor) &&
         (tensor.numel() < kFlagReadBelow || !reads_input_before_agreeing(tensor));
}

bool CompressedAllreduce::reads_input_before_agreeing(const at::Tensor& tensor) const {
  if (!(tensor.is_cpu() && tensor.scalar_type() == at::kFloat && tensor.is_contiguous())) return false;
  if (momentum_ > 0) return true;
  return error_feedback_ && exact_selection(*codec_) && (!exchange_ || exchange_ == &oneshot_scheme());
}

bool CompressedAllreduce::selects_in_input_pass(const at::Tensor& tensor, const Plan& how) const {
  if (!(error_feedback_ && how.codec && how.exchange == &oneshot_scheme().exchange() && tensor.is_cpu() &&
        tensor.scalar_type() == at::kFloat && tensor.is_contiguous())) {
    return false;
  }
  if (how.pieces.empty()) return exact_selection(*how.codec) != nullptr;
  return std::any_of(how.pieces.begin(), how.pieces.end(),
                     [](const CodecPiece& piece) { return exact_selection(*piece.codec) != nullptr; });
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
  if (!exchange_ && cost.compressed >= cost.dense) {  // auto
    return {true, "compressed it would send " + std::to_string(cost.compressed) + " bytes per rank, the transport's " +
                      std::to_string(cost.dense)};
  }
  return {};
}

}  // namespace gradzip
