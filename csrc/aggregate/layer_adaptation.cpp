// Layer-aware compression (layers=on, adapt; CPU tensors): a tensor of pieces compressed
// piece by piece, pieces under kSmallPiece elements exact. With adapt, each piece's level
// is chosen from its errors summed over every rank (layer_budget.h), within the bytes of
// the spec's level or the spec's `budget`, the same on every rank, on the first compressed
// call after the density warm-up and then every adapt_every calls.
#include "aggregate/layer_adaptation.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <vector>

namespace gradzip {

at::Tensor level_input(const at::Tensor& tensor, const CompressedState& state, double momentum) {
  at::Tensor input = tensor.detach().reshape({-1}).to(at::kFloat);
  if (state.velocity.defined()) input = state.velocity * momentum + input;
  return input;
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

}  // namespace gradzip
