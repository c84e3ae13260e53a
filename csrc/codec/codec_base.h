// CodecBase: a codec built from its parameters; ValueCodec adds error feedback around a
// codec's own encoder, the same for every codec that has no fused path of its own.
#pragma once

#include <functional>
#include <vector>

#include "codec/codec_record.h"

namespace gradzip {

class CodecBase : public Codec {
 public:
  explicit CodecBase(const CodecParameters& parameters) : parameters_(parameters) {}
  CodecId id() const final { return parameters_.id; }
  std::string name() const final { return codec_record(parameters_.id).name; }
  const CodecParameters& parameters() const final { return parameters_; }

 protected:
  CodecParameters parameters_;
};

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

}  // namespace gradzip
