// SelectionCodec: the codecs that send the k = ceil(density·n) entries of largest
// magnitude (top-k, STC). They share the selection (exact, or approximate from a
// sample), with u = x + residual fused into its first pass, and the residual update;
// each writes its own payload from the chosen indices.
#pragma once

#include <cmath>

#include "codec/entry_codec.h"
#include "codec/topk_select.h"

namespace gradzip {

// What every selection codec is given: k = ceil(density·n), and whether its threshold
// comes from a sample.
struct SelectionParameters {
  double density = 0.0;
  bool approx = false;
};

// Throws std::invalid_argument unless `chosen` is k ascending positions in [0, n)
// (EncodeContext::chosen).
void check_chosen(const std::vector<int64_t>& chosen, int64_t n, int64_t k);

// The exact selection's parameters of a top-k or STC codec; null for any other codec
// and where the selection is approximate (approx=1).
const SelectionParameters* exact_selection(const Codec& codec);

// The most entries a selection codec sends for n elements: k, or with approx = true up
// to min(n, 2k + 64); an approximate threshold that lets more through is replaced by the
// exact selection, on the CPU and on the GPU alike.
int64_t max_selected(const SelectionParameters& selection, int64_t n);

// Parameters: a struct with a SelectionParameters `selection` (TopKParameters,
// StcParameters); Self: the codec (with_budget builds another).
template <class Self, class Parameters>
class SelectionCodec : public EntryCodec, public WithParameters<Parameters> {
 public:
  SelectionCodec(CodecId id, const Parameters& parameters) : EntryCodec(id), WithParameters<Parameters>(parameters) {}
  bool biased() const final { return true; }
  bool selects() const final { return true; }
  Budget budget() const final { return {BudgetKind::kDensity, selection().density}; }
  std::unique_ptr<Codec> with_budget(double density) const final {
    Parameters denser = this->parameters_;
    denser.selection.density = checked_density(*this, density);
    return std::make_unique<Self>(denser);
  }

  void encode(const float* x, int64_t n, float* residual, const EncodeContext& ctx,
              std::vector<uint8_t>& out) const final {
    const size_t start = out.size();
    std::vector<int64_t> selected;
    const std::vector<int64_t>* chosen = &selected;
    const int64_t k = count_for_density(selection().density, n);
    if (ctx.chosen && !selection().approx) {
      check_chosen(*ctx.chosen, n, k);
      chosen = ctx.chosen;
      if (residual) {
        for (int64_t i = 0; i < n; ++i) residual[i] += x[i];
      }
    } else if (selection().approx) {
      select_topk_approx(x, residual, n, k, selected);
      // The sampled threshold can let far more than k through: then select exactly from
      // u, which the approximate pass left in `residual` (or is x).
      if (static_cast<int64_t>(selected.size()) > max_selected(selection(), n)) {
        select_topk(residual ? residual : x, nullptr, n, k, selected);
      }
    } else {
      select_topk(x, residual, n, k, selected);
    }
    write(residual ? residual : x, n, *chosen, out);
    report_sent(ctx, *chosen);
    if (residual) decode_add(out.data() + start, out.size() - start, residual, n, -1.0f);  // sent entries only
  }

  // What is left out (the other elements' squares) plus chosen_error() of what is sent,
  // at each density. None with approx=1 (its selection is not the top k).
  std::vector<double> errors_at_budgets(const float* x, int64_t n, const std::vector<double>& densities) const final {
    if (selection().approx || !all_finite(x, n)) return {};
    std::vector<int64_t> ks;
    for (double density : densities) ks.push_back(count_for_density(density, n));
    const std::vector<MagnitudeSums> sums = top_magnitude_sums(x, n, ks);
    std::vector<double> errors;
    for (size_t l = 0; l < ks.size(); ++l) {
      const double chosen = chosen_error(ks[l], sums[l]);
      if (std::isnan(chosen)) return {};
      errors.push_back(sums[l].rest_squares + chosen);
    }
    return errors;
  }

 protected:
  const SelectionParameters& selection() const { return this->parameters_.selection; }
  // The squared error of what the payload carries for the k chosen entries, from their
  // magnitudes' sums; NaN when these sums do not tell (errors_at_budgets() then gives none).
  virtual double chosen_error(int64_t k, const MagnitudeSums& sums) const = 0;
  // Appends the payload (header included) of u's entries at `chosen` (ascending).
  virtual void write(const float* u, int64_t n, const std::vector<int64_t>& chosen, std::vector<uint8_t>& out) const = 0;
};

// density: the share of elements a selection codec (and random-k) sends.
SpecKey density_key();
// density_warmup: how many compressed all-reduces of a tensor send more than density
// (read by the aggregation, aggregate/compressed_allreduce.h; codecs ignore it).
SpecKey density_warmup_key();
// momentum: DGC's momentum correction with factor masking (read by the aggregation).
SpecKey momentum_key();
// density, density_warmup, momentum and approx: the keys of every selection codec.
std::vector<SpecKey> selection_keys();
// density and approx from a spec with selection_keys() checked and filled in.
SelectionParameters parse_selection(const Spec& spec);

// The record of a selection codec: selection_keys() (a codec adds its own after them),
// and a codec built from parse(spec).
template <CodecId kId, class SelectionType, auto parse>
CodecRecord selection_record(std::string name, std::string summary, const DeviceHalf* device) {
  return {kId,
          std::move(name),
          std::move(summary),
          selection_keys(),
          [](const Spec& spec) -> std::unique_ptr<Codec> { return std::make_unique<SelectionType>(parse(spec)); },
          device};
}

}  // namespace gradzip
