// Layer budget: each layer's compression level chosen under the bytes of the spec's own
// level (the spec's `layers=adapt`), in the spirit of L-GreCo (Markov et al., MLSys 2024):
// a layer whose gradient the spec's density (or bits) would compress badly gets more, one
// it compresses well gets less, and the bucket sends no more bytes than with the spec's
// level everywhere. The levels of a codec are the codec at densities ×1/8 .. ×8 of the
// spec's in steps of √2 (top-k, random-k, STC; at most 1), or with levels + 1 scaled by
// 1/8 .. 8 in steps of 2 (QSGD: 3 bits fewer .. 3 more; 1 level at the least). The error
// of a level on a layer is the squared distance between what the call adds to the
// layer's input (not its residual, which depends on the level chosen last) and its
// decoded payload, summed over the ranks in rank order, so every rank solves the same
// problem with the same numbers and chooses the same levels. The choice is a
// multiple-choice knapsack, solved by dynamic programming over the budget in kBudgetBins
// steps (each level's bytes rounded up, so the choice never exceeds the budget), and kept
// only where it beats the spec's level everywhere. The spec's `budget` key sets the bytes
// instead (a fraction of the fp32 bytes): researchers compare codecs at one budget that
// way.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>
#include <vector>

#include "gradzip/codec.h"

namespace gradzip {

// A codec's levels, fewest slot bytes first; `base` indexes the codec itself.
struct CodecLevels {
  std::vector<std::shared_ptr<const Codec>> codecs;
  int base = 0;
};

// The most levels a codec has (densities ×2^-3 .. ×2^3 in steps of √2).
constexpr int kMaxLevels = 13;

// Whether `codec` has levels to choose among (a density or QSGD's levels).
bool has_levels(const Codec& codec);
// The levels of `codec` (has_levels must hold).
CodecLevels codec_levels(const std::shared_ptr<const Codec>& codec);

// The budget's resolution: the dynamic programme counts bytes in steps of budget / this.
constexpr int64_t kBudgetBins = 4096;

// For each layer i, the level l minimising Σ error[i][l] under Σ bytes[i][l] ≤ `budget`
// (below 0: the bytes of every layer at level `base`). Returns `base` for every layer
// when that fits the budget and no choice within it has a smaller total error (ties keep
// the base); level 0 (the fewest bytes) for every layer when nothing fits. Every row of
// `error` and `bytes` has one entry per level; errors must be finite.
std::vector<int> choose_levels(const std::vector<std::vector<double>>& error,
                               const std::vector<std::vector<int64_t>>& bytes, int base, int64_t budget = -1);

// The squared error of each level on x (contiguous float32, CPU): ‖x − decode(encode(x))‖²
// in float64, each level encoding without error feedback under `ctx`; from one look at x
// where the codec has that shortcut (Codec::errors_at_budgets: top-k, STC).
std::vector<double> level_errors(const CodecLevels& levels, const at::Tensor& x, const EncodeContext& ctx);

// `table` (float64, CPU) summed over the ranks of `transport` in rank order: the same bits
// on every rank.
at::Tensor summed_in_rank_order(const at::Tensor& table, const c10::intrusive_ptr<c10d::Backend>& transport);

}  // namespace gradzip
