// Error feedback's first step and an exact selection's first pass (top-k, STC), made on
// the host in one pass over an all-reduce's input before the ranks agree on finiteness;
// internal to csrc/aggregate. Otherwise a call reads its input three times: a pass that
// checks it for Inf and NaN (with momentum correction: makes the next velocity), the
// encoder's pass that makes u = x + residual and collects its candidates, and the
// exchange's pass that zeroes x as the sum. Here one pass does the first two, the encoder
// reads none of u to select (it writes the chosen entries and takes what it sends back
// out of the residual: sparse work), and the decode writes the sum over x range by range
// (entry_codec.h) instead of adding the payloads into a zeroed x.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "aggregate/compressed_allreduce.h"

namespace gradzip {

class ResidualSelection {
 public:
  // What one encode of the exchange compresses: a round's piece of x (one-shot's rounds),
  // or of one of its layers (a piecewise codec cuts the rounds at the layers), with the
  // density of its codec's exact selection (0: its codec does not select exactly; it
  // gets no candidates).
  struct EncodePiece {
    Chunk chunk;
    double density;
  };
  // The pieces of a one-shot all-reduce of n elements over `ranks` by `codec`: its rounds
  // (oneshot_rounds with `rounds_requested`), cut at `layers` where a layer-aware codec
  // compresses them (empty: `codec` compresses every round whole).
  static std::vector<EncodePiece> oneshot_pieces(const Codec& codec, const std::vector<CodecPiece>& layers,
                                                 int64_t n, int ranks, int64_t rounds_requested);

  // The pass: for a float32 x on the host that is also the sum the exchange writes (in
  // place), with `momentum` m > 0 first v' = m·v + x into the state's spare velocity
  // (momentum correction, rounded as add_momentum rounds), then u = (v' or x) + residual
  // into the state's spare residual (the velocity and residual untouched, so a step the
  // ranks refuse changes no state), x checked for Inf and NaN (and only read: the
  // exchange writes the sum over it), and for each of `pieces` (consecutive, covering x) that
  // selects, the candidates at or above a threshold sampled from it (topk_select.h). u is
  // rounded as the encoder's own pass rounds it: the same bits. Costs a second residual's
  // memory (4 bytes per element, kept between calls).
  ResidualSelection(CompressedState& state, const at::Tensor& x, double momentum, std::vector<EncodePiece> pieces,
                    const std::string& key);

  // Whether x held no Inf or NaN.
  bool finite() const { return finite_; }

  // After the ranks agreed to take the step: the spare residual becomes the residual,
  // holding u (the old one's storage is the next spare). The spare velocity, as the
  // momentum pass leaves it, is taken by take_spare_velocity (momentum_correction.h).
  void take(CompressedState& state);

  // `codec` (a host codec of one of the pieces above, or of a round that is one) made to
  // encode the residual in x's place: encode() ignores x, encodes the residual without
  // error feedback, at the positions chosen from its piece's candidates where they decide
  // (EncodeContext::chosen; else the codec selects from u itself), then adds −1 × its own
  // payload into the residual, leaving fl(u − sent) there: the payload and residual the
  // codec's encode of (x, the old residual) gives. Valid while this object lives, after
  // take().
  std::unique_ptr<SlotCodec> encoding_residual(std::unique_ptr<SlotCodec> codec) const;

  // What the pass found in one piece.
  struct Piece {
    Chunk chunk;
    int64_t k;
    bool sampled;  // candidates were collected (a selection, large enough to sample)
    std::vector<std::pair<uint32_t, int64_t>> candidates;  // (key, index in the piece), index order
  };

 private:
  std::vector<Piece> pieces_;
  const float* residual_ = nullptr;  // u's storage, after take()
  bool finite_ = true;
};

}  // namespace gradzip
