// CodecBase: error feedback around a codec's own encoder, the same for every codec.
// A codec may override encode() to fuse the residual update into its own passes, as
// long as it leaves exactly what the generic path leaves.
#pragma once

#include <vector>

#include "gradzip/codec.h"

namespace gradzip {

class CodecBase : public Codec {
 public:
  // u = x (+ residual); encode_values(u); then residual = fl(u − decode(payload)), so
  // the residual keeps exactly what the receivers did not get.
  void encode(const float* x, int64_t n, float* residual, const EncodeContext& ctx,
              std::vector<uint8_t>& out) const override;

 protected:
  // Appends the payload of u[0..n) (header included) to `out`.
  virtual void encode_values(const float* u, int64_t n, const EncodeContext& ctx,
                             std::vector<uint8_t>& out) const = 0;
};

// A codec's parameters as its spec sets them (defaults filled in, values checked):
// what make_codec() builds from, and what a GPU encoder is given.
struct CodecParameters {
  CodecId id = CodecId::kIdentity;
  double density = 0.0;   // topk, randomk, stc
  bool approx = false;    // topk, stc: threshold from a sample
  bool unbiased = false;  // randomk
  int64_t block = 0;      // sign: elements per scale (0 = plain signs)
  int levels = 0;         // qsgd
  int64_t bucket = 0;     // qsgd
  bool max_norm = false;  // qsgd
};
CodecParameters codec_parameters(const Spec& spec);

// The codec factories, one per file.
std::unique_ptr<Codec> make_identity_codec();
std::unique_ptr<Codec> make_fp16_codec();
std::unique_ptr<Codec> make_bf16_codec();
std::unique_ptr<Codec> make_topk_codec(double density, bool approx);
std::unique_ptr<Codec> make_randomk_codec(double density, bool unbiased);
std::unique_ptr<Codec> make_stc_codec(double density, bool approx);
std::unique_ptr<Codec> make_sign_codec(int64_t block);
std::unique_ptr<Codec> make_qsgd_codec(int levels, int64_t bucket, bool max_norm);

// STC's Golomb-Rice parameter for k positions among n (0 when k = 0 or k = n).
constexpr int kMaxGolombParameter = 40;
int stc_golomb_parameter(int64_t k, int64_t n);

// k = ceil(density × n), clamped to [0, n].
int64_t count_for_density(double density, int64_t n);

}  // namespace gradzip
