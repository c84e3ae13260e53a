// CompressedAllreduce's all-reduce, a call's sequence: its state (a tensor of pieces' one
// state assembled from its pieces' and handed back as views), its plan, its residuals
// owned, levels agreed (layers=adapt), finiteness agreed, the step taken, momentum added,
// the exchange, masking, the result written and counted; take_step, shared with the
// reduce-scatter. What each step means lives beside it: compressed_plan.cpp,
// compressed_residuals.cpp, momentum_correction.cpp, layer_adaptation.cpp,
// compressed_loss_scale.cpp.
#include "aggregate/compressed_allreduce.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "work/completed_work.h"
#include "aggregate/compressed_residuals.h"
#include "aggregate/exact_allreduce.h"
#include "aggregate/finite_step.h"
#include "aggregate/layer_adaptation.h"
#include "aggregate/momentum_correction.h"
#include "aggregate/residual_selection.h"

namespace gradzip {
namespace {

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

}  // namespace

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
  if (error_feedback_ && how.exchange) {
    own_chunk(state, how.owned, codec_device(*codec_, tensors.front()), tensors.front().numel(), key);
  }
  return run(tensors, opts, transport, stats, key, lock, state, how, key, all_finite);
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
  const bool keep = error_feedback_ && how.exchange;
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
    whole.spare_residual = states_[pieces.front().key].spare_residual;  // kept by the first piece
    if (!velocities.empty()) {
      whole.velocity = end_to_end(velocities);
      whole.spare_velocity = states_[pieces.front().key].spare_velocity;  // likewise
    }
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
  if (keep) {
    states_[pieces.front().key].spare_velocity = whole.spare_velocity;
    states_[pieces.front().key].spare_residual = whole.spare_residual;
  }
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
  if (!how.exchange) {
    ++state.calls;
    lock.unlock();
    return exact_allreduce(tensors, opts, transport, stats);
  }
  const int64_t n = tensor.numel();
  const int ranks = transport->getSize();
  const at::Device device = codec_device(*codec_, tensor);
  ExchangeCall call;
  call.x = tensor.detach().reshape({n}).to(device, at::kFloat).contiguous();  // the exchanges cut it in chunks
  // An fp32 tensor on the codec's device is its own sum (the encoder reads it, or the
  // velocity made from it, before anything is written): no 4n-byte buffer and no pass to
  // copy it back.
  const bool in_place = tensor.device() == device && tensor.scalar_type() == at::kFloat && tensor.is_contiguous();
  // On the host, one pass reads x for everything before the ranks agree: an exact
  // selection over one-shot makes u = x + residual there (with momentum correction, from
  // the next velocity) and collects its candidates (residual_selection.h), and the decode
  // then writes the sum over x; otherwise, with momentum correction, the next velocity
  // goes into the spare and x is zeroed as the sum. Either way x's finiteness is checked.
  std::optional<ResidualSelection> selection;
  if (selects_in_input_pass(tensor, how)) {
    selection.emplace(state, call.x, momentum_,
                      ResidualSelection::oneshot_pieces(*how.codec, how.pieces, n, ranks, rounds_for(tensor)), key);
  }
  const bool spare = momentum_ > 0 && in_place && device.is_cpu();  // the next velocity is in the spare
  bool finite_here = true;
  if (selection) {
    finite_here = selection->finite();
  } else if (spare) {
    finite_here = velocity_into_spare(state, call.x, momentum_, key);
  }
  lock.unlock();
  if (agree_on_finiteness_ &&
      !(all_finite ? *all_finite
                   : finite_on_every_rank(spare || selection ? finite_here : locally_finite(call.x), transport,
                                          tensor.device()))) {
    tensor.fill_(std::numeric_limits<float>::quiet_NaN());
    return completed_work(tensors);
  }
  lock.lock();
  if (selection) selection->take(state);
  take_step(state, key, seed_key, opts.reduceOp.op_, *transport, call);
  if (error_feedback_ && how.owned.length > 0) call.owner_residual = state.owner_residual;
  call.transport_device = tensor.device();
  call.rounds = rounds_for(tensor);
  call.sum_zeroed = spare && !selection;
  const bool masking = momentum_ > 0 && how.codec->selects();
  std::vector<int64_t> sent_positions;
  at::Tensor unsent;
  if (spare) {
    take_spare_velocity(state, call, masking, sent_positions);
  } else if (momentum_ > 0) {
    unsent = add_momentum(state, call, momentum_, key, masking, sent_positions);
  }
  TORCH_INTERNAL_ASSERT(!unsent.defined() || how.pieces.empty(), "gradzip: layer-aware momentum masking runs on the host");
  lock.unlock();

  const c10::OptionalDeviceGuard guard(device.is_cuda() ? std::optional<at::Device>(device) : std::nullopt);
  at::Tensor sum = in_place ? tensor.view({n}) : at::empty({n}, at::dtype(at::kFloat).device(device));
  PieceCodecWrap encoding_residual;  // with a selection made in the input pass, each codec encodes u
  if (selection) {
    encoding_residual = [&](std::unique_ptr<SlotCodec> c) { return selection->encoding_residual(std::move(c)); };
  }
  std::unique_ptr<SlotCodec> codec = how.pieces.empty() ? slot_codec(how.codec, device)
                                                        : piecewise_codec(how.pieces, encoding_residual);
  if (selection && how.pieces.empty()) codec = encoding_residual(std::move(codec));
  const int64_t sent = how.exchange->allreduce(*codec, *how.codec, call, sum, transport);
  if (masking) mask_momentum(state, call, unsent, sent_positions);
  if (majority_) sum.sign_();
  if (!in_place) tensor.copy_(sum.view(tensor.sizes()));
  stats.add(sent, sent, ring_allreduce_bytes(n * 4, ranks));
  return completed_work(tensors);
}

}  // namespace gradzip
