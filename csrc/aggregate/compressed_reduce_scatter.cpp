// CompressedAllreduce's reduce-scatter (reduce_scatter=compressed: FSDP's gradients), a
// call's sequence: exact when planned so (warned once per key when the user did not ask),
// else finiteness agreed, levels agreed (layers=adapt), the step taken, momentum added,
// the compressed or hierarchical reduce-scatter, masking, the shard written and counted.
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <limits>
#include <optional>
#include <string>

#include "work/completed_work.h"
#include "aggregate/compressed_allreduce.h"
#include "aggregate/exact_allreduce.h"
#include "aggregate/finite_step.h"
#include "aggregate/layer_adaptation.h"
#include "aggregate/momentum_correction.h"

namespace gradzip {

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
  const auto tensor = pieces.empty() ? slot_codec(codec, device) : piecewise_codec(std::move(pieces));
  const int64_t sent = hierarchy ? hierarchical_reduce_scatter(hierarchy->levels, *tensor, *codec, call, shard, transport)
                                 : compressed_reduce_scatter(*tensor, *codec, call, shard, transport);
  if (masking) mask_momentum(state, call, unsent, sent_positions);
  if (majority_) shard.sign_();
  output.copy_(shard.view(output.sizes()));
  stats.add(sent, sent, (ranks - 1) * output.numel() * 4);
  return completed_work(outputs);
}

}  // namespace gradzip
