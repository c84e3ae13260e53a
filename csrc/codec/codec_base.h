// CodecBase: a codec with its wire id (its parameters: WithParameters, codec_record.h);
// ValueCodec adds error feedback around a codec's own encoder, the same for every codec
// that has no fused path of its own.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "codec/codec_record.h"

namespace gradzip {

class CodecBase : public Codec {
 public:
  explicit CodecBase(CodecId id) : id_(id) {}
  CodecId id() const final { return id_; }
  std::string name() const final { return codec_record(id_).name; }

 private:
  CodecId id_;
};

// `density` when it lies in (0, 1], what a with_budget() of a density takes; else
// std::invalid_argument naming the codec.
double checked_density(const Codec& codec, double density);

class ValueCodec : public CodecBase {
 public:
  using CodecBase::CodecBase;
  // u = x (+ residual); encode_values(u); then residual = fl(u − decode(payload)), so
  // the residual keeps exactly what the receivers did not get. A codec may override
  // encode() to fuse the residual update into its own passes, leaving the same.
  void encode(const float* x, int64_t n, float* residual, const EncodeContext& ctx,
              std::vector<uint8_t>& out) const override;

 protected:
  // Appends the payload of u[0..n) (header included) to `out`.
  virtual void encode_values(const float* u, int64_t n, const EncodeContext& ctx,
                             std::vector<uint8_t>& out) const = 0;
  // encode_into() for a codec that writes its payload in place: u = x (+ residual) as
  // encode() makes it, write(u) writes u's payload into `out` and returns its size, then
  // the same residual update as encode().
  size_t encode_in_place(const float* x, int64_t n, float* residual, uint8_t* out,
                         const std::function<size_t(const float* u)>& write) const;
};

// A codec whose payload gives every element bits of its own (identity, fp16, bf16, sign,
// qsgd): it decodes any range of the elements. A sum of several payloads can then go
// range by range, each payload's part of a range in turn (add_rows_by_range), and read
// and write its output once instead of once per payload, with the same bits.
class ElementwiseCodec : public ValueCodec {
 public:
  using ValueCodec::ValueCodec;
  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const final {
    decode_add_range(data, size, out, n, 0, n, scale);
  }
  // Adds scale × elements [begin, end) of the payload of n elements into out[begin, end),
  // each element rounded as decode_add() rounds it. Checks the payload's layout (and the
  // range's values) as decode_add() does: PayloadError.
  virtual void decode_add_range(const uint8_t* data, size_t size, float* out, int64_t n, int64_t begin, int64_t end,
                                float scale) const = 0;
};

// Elements per range of add_rows_by_range: the output's part stays in L1 while every
// payload adds into it.
inline constexpr int64_t kDecodeRange = 4096;

// out[0, n) += scale × the elements of payload 0, then of payload 1, ... (payload r:
// `size(r)` bytes at `data(r)`), range by range: the bits of decode_add() of each payload
// in turn. A PayloadError from payload r goes to on_error(r, error), which throws.
template <class Data, class Size, class OnError>
void add_rows_by_range(const ElementwiseCodec& codec, int rows, Data data, Size size, float* out, int64_t n,
                       float scale, OnError on_error) {
  int64_t begin = 0;
  do {  // once at least, so that every payload's layout is checked when n = 0
    const int64_t end = std::min(n, begin + kDecodeRange);
    for (int r = 0; r < rows; ++r) {
      try {
        codec.decode_add_range(data(r), size(r), out, n, begin, end, scale);
      } catch (const PayloadError& e) {
        on_error(r, e);
      }
    }
    begin = end;
  } while (begin < n);
}

}  // namespace gradzip
