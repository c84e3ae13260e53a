#include "aggregate/layer_budget.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "aggregate/slots.h"

namespace gradzip {
namespace {

// Levels ×2^-3 .. ×2^3 of the spec's: densities in steps of √2 (the bytes of a
// selection grow with it; finer steps leave less of the budget unspent), QSGD's levels + 1
// in steps of 2 (a bit each).
constexpr int kDensitySteps = 6;
constexpr int kLevelSteps = 3;
static_assert(2 * kDensitySteps + 1 == kMaxLevels && kLevelSteps <= kDensitySteps);

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double total_error(const std::vector<std::vector<double>>& error, const std::vector<int>& choice) {
  double total = 0;
  for (size_t i = 0; i < choice.size(); ++i) total += error[i][static_cast<size_t>(choice[i])];
  return total;
}

}  // namespace

bool has_levels(const Codec& codec) { return codec.budget().kind != BudgetKind::kNone; }

CodecLevels codec_levels(const std::shared_ptr<const Codec>& codec) {
  TORCH_CHECK(has_levels(*codec), "gradzip: codec '", codec->name(), "' has no density or levels to choose");
  const Budget base = codec->budget();
  const bool density = base.kind == BudgetKind::kDensity;
  CodecLevels levels;
  const int steps = density ? kDensitySteps : kLevelSteps;
  for (int step = -steps; step <= steps; ++step) {
    if (step == 0) {
      levels.base = static_cast<int>(levels.codecs.size());
      levels.codecs.push_back(codec);
      continue;
    }
    if (density) {
      const double scaled = base.value * std::exp2(step / 2.0);
      if (scaled > 1.0) continue;
      levels.codecs.push_back(codec->with_budget(scaled));
    } else {
      const auto plus_one = static_cast<int64_t>(base.value) + 1;
      const int64_t levels_count = (step > 0 ? plus_one << step : plus_one >> -step) - 1;
      if (levels_count < 1 || levels_count > kMaxBudgetLevels) continue;
      levels.codecs.push_back(codec->with_budget(static_cast<double>(levels_count)));
    }
  }
  return levels;
}

std::vector<int> choose_levels(const std::vector<std::vector<double>>& error,
                               const std::vector<std::vector<int64_t>>& bytes, int base, int64_t budget) {
  const size_t layers = error.size();
  TORCH_CHECK(bytes.size() == layers, "gradzip: ", layers, " layers of errors but ", bytes.size(), " of bytes");
  std::vector<int> at_base(layers, base);
  if (layers == 0) return at_base;
  const size_t count = error.front().size();
  int64_t at_base_bytes = 0;
  for (size_t i = 0; i < layers; ++i) {
    TORCH_CHECK(error[i].size() == count && bytes[i].size() == count && base >= 0 &&
                    static_cast<size_t>(base) < count,
                "gradzip: layer ", i, " has ", error[i].size(), " errors and ", bytes[i].size(), " byte counts for ",
                count, " levels (base ", base, ")");
    for (size_t l = 0; l < count; ++l) {
      TORCH_CHECK(std::isfinite(error[i][l]) && bytes[i][l] > 0, "gradzip: layer ", i, " level ", l,
                  " has error ", error[i][l], " and ", bytes[i][l], " bytes");
    }
    at_base_bytes += bytes[i][static_cast<size_t>(base)];
  }
  if (budget < 0) budget = at_base_bytes;
  const std::vector<int> cheapest(layers, 0);
  // best[w]: the least error of the layers so far within w units; pick[i][w]: layer i's
  // level there (-1: none fits).
  const int64_t unit = std::max<int64_t>(1, ceil_div(budget, kBudgetBins));
  const auto capacity = static_cast<size_t>(budget / unit);
  constexpr double kNone = std::numeric_limits<double>::infinity();
  std::vector<double> best(capacity + 1, 0.0), next(capacity + 1);
  std::vector<std::vector<int8_t>> pick(layers, std::vector<int8_t>(capacity + 1, -1));
  for (size_t i = 0; i < layers; ++i) {
    std::fill(next.begin(), next.end(), kNone);
    for (size_t l = 0; l < count; ++l) {
      const auto cost = static_cast<size_t>(ceil_div(bytes[i][l], unit));
      for (size_t w = cost; w <= capacity; ++w) {
        const double e = best[w - cost] + error[i][l];
        if (e < next[w]) {
          next[w] = e;
          pick[i][w] = static_cast<int8_t>(l);
        }
      }
    }
    best.swap(next);
  }
  if (!(best[capacity] < kNone)) return at_base_bytes <= budget ? at_base : cheapest;
  std::vector<int> choice(layers);
  size_t w = capacity;
  for (size_t i = layers; i-- > 0;) {
    choice[i] = pick[i][w];
    w -= static_cast<size_t>(ceil_div(bytes[i][static_cast<size_t>(choice[i])], unit));
  }
  if (at_base_bytes > budget) return choice;
  return total_error(error, choice) < total_error(error, at_base) ? choice : at_base;
}

std::vector<double> level_errors(const CodecLevels& levels, const at::Tensor& x, const EncodeContext& ctx) {
  TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "gradzip: level errors take a contiguous float32 CPU tensor");
  const int64_t n = x.numel();
  const float* v = x.data_ptr<float>();
  std::vector<double> budgets;
  for (const auto& codec : levels.codecs) budgets.push_back(codec->budget().value);
  std::vector<double> shortcut = levels.codecs.front()->errors_at_budgets(v, n, budgets);
  if (!shortcut.empty()) return shortcut;
  std::vector<uint8_t> payload;
  std::vector<float> decoded(static_cast<size_t>(n));
  std::vector<double> errors;
  for (const auto& codec : levels.codecs) {
    payload.clear();
    codec->encode(v, n, nullptr, ctx, payload);
    std::fill(decoded.begin(), decoded.end(), 0.0f);
    codec->decode_add(payload.data(), payload.size(), decoded.data(), n);
    double e = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double d = static_cast<double>(v[j]) - decoded[static_cast<size_t>(j)];
      e += d * d;
    }
    errors.push_back(e);
  }
  return errors;
}

at::Tensor summed_in_rank_order(const at::Tensor& table, const c10::intrusive_ptr<c10d::Backend>& transport) {
  TORCH_CHECK(table.is_cpu() && table.scalar_type() == at::kDouble, "gradzip: a table to sum must be float64 on the CPU");
  const at::Tensor mine = table.contiguous().view({-1});
  const int ranks = transport->getSize();
  at::Tensor all = at::empty({ranks * mine.numel()}, mine.options());
  at::Tensor all_bytes = all.view(at::kByte);
  at::Tensor mine_bytes = mine.view(at::kByte);
  transport->_allgather_base(all_bytes, mine_bytes)->wait();
  at::Tensor sum = at::zeros_like(mine);
  for (int r = 0; r < ranks; ++r) sum.add_(all.narrow(0, r * mine.numel(), mine.numel()));
  return sum.view(table.sizes());
}

}  // namespace gradzip
