#include "aggregate/piecewise_codec.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace gradzip {
namespace {

class PiecewiseSlotCodec final : public SlotCodec {
 public:
  PiecewiseSlotCodec(std::vector<CodecPiece> pieces, PieceCodecWrap wrap) : wrap_(std::move(wrap)) {
    TORCH_CHECK(!pieces.empty(), "gradzip: a piecewise codec needs at least one piece");
    for (auto& piece : pieces) {
      TORCH_CHECK(piece.numel > 0 && piece.codec, "gradzip: a piece needs elements and a codec");
      std::unique_ptr<SlotCodec> codec = slot_codec(piece.codec, at::kCPU);
      if (wrap_) codec = wrap_(std::move(codec));
      parts_.push_back({numel_, piece.numel, bytes_, gradzip::slot_bytes(*piece.codec, piece.numel),
                        std::move(codec), piece.codec});
      numel_ += piece.numel;
      bytes_ += parts_.back().slot_bytes;
    }
  }

  bool uniform() const override { return false; }

  int64_t slot_bytes(int64_t n) const override {
    check_numel(n);
    return bytes_;
  }

  // Elements [begin, begin + length): the pieces cut to it, each with its codec.
  std::unique_ptr<SlotCodec> part(int64_t begin, int64_t length) const override {
    TORCH_CHECK(begin >= 0 && length > 0 && begin + length <= numel_, "gradzip: elements [", begin, ", ",
                begin + length, ") are not within the ", numel_, " of a piecewise codec");
    std::vector<CodecPiece> cut;
    for (const Part& p : parts_) {
      const int64_t from = std::max(begin, p.offset);
      const int64_t to = std::min(begin + length, p.offset + p.numel);
      if (from < to) cut.push_back({to - from, p.codec_of_piece});
    }
    return std::make_unique<PiecewiseSlotCodec>(std::move(cut), wrap_);
  }

  // Piece i is encoded under piece_context(ctx, i), its sent positions reported at its
  // place in the tensor.
  void encode(const at::Tensor& x, const at::Tensor& residual, const EncodeContext& ctx,
              at::Tensor slot) const override {
    check_numel(x.numel());
    TORCH_CHECK(slot.numel() >= bytes_, "gradzip: a piecewise slot has ", bytes_, " bytes, got ", slot.numel());
    for (size_t i = 0; i < parts_.size(); ++i) {
      const Part& p = parts_[i];
      EncodeContext of_piece = piece_context(ctx, i);
      of_piece.sent_offset += p.offset;
      p.codec->encode(x.narrow(0, p.offset, p.numel),
                      residual.defined() ? residual.narrow(0, p.offset, p.numel) : at::Tensor(), of_piece,
                      slot.narrow(0, p.slot_offset, p.slot_bytes));
    }
    slot.narrow(0, bytes_, slot.numel() - bytes_).zero_();  // a chunk's slot may be longer
  }

  void decode_sum(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    decode_rows(slots, stride, rows, sum, scale, /*set=*/true);
  }

  void decode_add(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    decode_rows(slots, stride, rows, sum, scale, /*set=*/false);
  }

  // Row r's piece p alone: its slot is given as a row of its own size.
  void decode_each(const at::Tensor& slots, int64_t stride, const std::vector<at::Tensor>& targets,
                   float scale) const override {
    check_rows(slots, stride, static_cast<int>(targets.size()));
    check_declared_sizes(slots, stride, static_cast<int>(targets.size()));
    for (size_t r = 0; r < targets.size(); ++r) {
      check_numel(targets[r].numel());
      for (const Part& p : parts_) {
        try {
          p.codec->decode_each(slots.narrow(0, static_cast<int64_t>(r) * stride + p.slot_offset, p.slot_bytes),
                               p.slot_bytes, {targets[r].narrow(0, p.offset, p.numel)}, scale);
        } catch (const SlotError& e) {
          throw SlotError(static_cast<int>(r), e.what());
        }
      }
    }
  }

 private:
  struct Part {
    int64_t offset;       // of its elements in the tensor
    int64_t numel;
    int64_t slot_offset;  // of its slot in the tensor's
    int64_t slot_bytes;
    std::unique_ptr<SlotCodec> codec;
    std::shared_ptr<const Codec> codec_of_piece;
  };

  // Every piece's rows added into its part of `sum`, or (set) into zeros.
  void decode_rows(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale, bool set) const {
    check_numel(sum.numel());
    check_rows(slots, stride, rows);
    check_declared_sizes(slots, stride, rows);
    for (const Part& p : parts_) {
      const at::Tensor part = sum.narrow(0, p.offset, p.numel);
      if (set) {
        p.codec->decode_sum(rows_of(slots, p), stride, rows, part, scale);
      } else {
        p.codec->decode_add(rows_of(slots, p), stride, rows, part, scale);
      }
    }
  }
  void check_numel(int64_t n) const {
    TORCH_CHECK(n == numel_, "gradzip: a piecewise codec of ", numel_, " elements was given ", n,
                " (an exchange must take the part() of each chunk)");
  }
  void check_rows(const at::Tensor& slots, int64_t stride, int rows) const {
    TORCH_CHECK(stride >= bytes_ && slots.numel() >= rows * stride, "gradzip: ", rows, " piecewise slots of ",
                bytes_, " bytes do not fit ", slots.numel(), " bytes ", stride, " apart");
  }
  // Every piece's slot declares a payload within that slot (the pieces' codecs check
  // against the stride, which holds the other pieces too). Throws SlotError(row).
  void check_declared_sizes(const at::Tensor& slots, int64_t stride, int rows) const {
    const uint8_t* base = slots.data_ptr<uint8_t>();
    for (int r = 0; r < rows; ++r) {
      for (const Part& p : parts_) {
        uint64_t declared;
        std::memcpy(&declared, base + r * stride + p.slot_offset, sizeof declared);
        slot_payload_size(declared, p.slot_bytes, r);
      }
    }
  }
  // The slots of every row from part p's on: part p's slot of row r at r·stride.
  static at::Tensor rows_of(const at::Tensor& slots, const Part& p) {
    return slots.narrow(0, p.slot_offset, slots.numel() - p.slot_offset);
  }

  PieceCodecWrap wrap_;
  std::vector<Part> parts_;
  int64_t numel_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace

EncodeContext piece_context(const EncodeContext& ctx, size_t piece) {
  EncodeContext of_piece = ctx;
  of_piece.seed = seed_for_key(ctx.seed, "piece:" + std::to_string(piece));
  return of_piece;
}

std::unique_ptr<SlotCodec> piecewise_codec(std::vector<CodecPiece> pieces, PieceCodecWrap wrap) {
  return std::make_unique<PiecewiseSlotCodec>(std::move(pieces), std::move(wrap));
}

}  // namespace gradzip
