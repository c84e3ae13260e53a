// Piecewise codec: a tensor made of pieces (a DDP bucket of parameters) compressed piece
// by piece into one slot, for layer-aware compression (the spec's `layers=on`). Each
// piece has a codec of its own — a selection codec then selects within the piece, at its
// own density, instead of across the whole bucket — and the slot of the tensor is the
// pieces' slots end to end, each framed as any slot (aggregate/slots.h). Decoding adds
// every row's slot of a piece into the piece's part of the sum, rows in order, so every
// rank ends with the same bits. CPU tensors. Exchanges that cut the tensor (two-phase's
// chunks, a hierarchical exchange's shards) take part() of each cut: the pieces cut to it.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "aggregate/slot_codec.h"

namespace gradzip {

// One piece: its elements, and the codec that compresses them.
struct CodecPiece {
  int64_t numel;
  std::shared_ptr<const Codec> codec;
};

// Pieces under this many elements (biases, norms' scales) go as fp32, exact, when a
// selection codec compresses a tensor layer by layer: a few hundred elements selected at
// 1% would be a handful, and exact they cost next to nothing.
constexpr int64_t kSmallPiece = 1024;

// The context piece `piece` (its index in the tensor) is encoded under: a seed of its own,
// so that pieces draw independent numbers.
EncodeContext piece_context(const EncodeContext& ctx, size_t piece);

// Made of each piece's host codec (a part() of the piecewise codec wraps its pieces' again).
using PieceCodecWrap = std::function<std::unique_ptr<SlotCodec>(std::unique_ptr<SlotCodec>)>;

// The piecewise codec of a tensor that is `pieces` end to end (at least one); with
// `wrap`, each piece's codec is wrap(its host codec) (aggregate/residual_selection.h).
std::unique_ptr<SlotCodec> piecewise_codec(std::vector<CodecPiece> pieces, PieceCodecWrap wrap = nullptr);

}  // namespace gradzip
