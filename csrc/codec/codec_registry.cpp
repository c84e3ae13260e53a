#include <algorithm>

#include "codec/codec_base.h"

namespace gradzip {
namespace {

std::string names() {
  std::string out;
  for (const auto& kind : codec_kinds()) out += (out.empty() ? "" : ", ") + kind.name;
  return out;
}

[[noreturn]] void bad(const Spec& spec, const std::string& why) {
  throw SpecError("gradzip: spec '" + spec.str() + "': " + why);
}

double density(const Spec& spec) {
  const double d = spec.get_double("density", 0.01);
  if (!(d > 0.0 && d <= 1.0)) bad(spec, "density must be in (0, 1], got " + spec.params.at("density"));
  return d;
}

}  // namespace

const std::vector<CodecKind>& codec_kinds() {
  static const std::vector<CodecKind> kinds = {
      {"identity", "every element as fp32 (no compression)", {}},
      {"fp16", "every element as IEEE half (2 bytes)", {}},
      {"bf16", "every element as bfloat16 (2 bytes)", {}},
      {"topk", "the ceil(density·n) largest magnitudes as (index, value); approx=1 estimates the threshold",
       {"density", "approx"}},
      {"randomk", "ceil(density·n) elements chosen by a seed shared by all ranks; unbiased=1 scales by n/k",
       {"density", "unbiased"}},
      {"stc", "sparse ternary: top density·n positions (Golomb-coded) with one sign bit each and one mean",
       {"density", "approx"}},
      {"sign", "one sign bit per element; block>0 adds a scale per block (EF-SignSGD), vote=majority sends plain signs",
       {"block", "vote"}},
      {"qsgd", "stochastic quantization to s levels per bucket: bits (incl. sign) or levels, bucket, norm=l2|max",
       {"bits", "levels", "bucket", "norm"}},
  };
  return kinds;
}

CodecParameters codec_parameters(const Spec& spec) {
  CodecParameters p;
  if (spec.name == "identity") {
    p.id = CodecId::kIdentity;
  } else if (spec.name == "fp16") {
    p.id = CodecId::kFp16;
  } else if (spec.name == "bf16") {
    p.id = CodecId::kBf16;
  } else if (spec.name == "topk" || spec.name == "stc") {
    p.id = spec.name == "topk" ? CodecId::kTopK : CodecId::kStc;
    p.density = density(spec);
    p.approx = spec.get_bool("approx", false);
  } else if (spec.name == "randomk") {
    p.id = CodecId::kRandomK;
    p.density = density(spec);
    p.unbiased = spec.get_bool("unbiased", true);
  } else if (spec.name == "sign") {
    const std::string vote = spec.get_string("vote", "mean");
    if (vote != "mean" && vote != "majority") bad(spec, "vote must be 'mean' or 'majority', got '" + vote + "'");
    const int64_t block = spec.get_int("block", vote == "majority" ? 0 : 512);
    if (block < 0 || block > (int64_t{1} << 30)) bad(spec, "block must be in [0, 2^30]");
    if (vote == "majority" && block != 0) bad(spec, "vote=majority sends plain signs: block must be 0");
    p.id = CodecId::kSign;
    p.block = block;
  } else if (spec.name == "qsgd") {
    if (spec.has("bits") && spec.has("levels")) bad(spec, "give bits or levels, not both");
    int levels = 7;
    if (spec.has("bits")) {
      const int64_t bits = spec.get_int("bits", 4);
      if (bits < 2 || bits > 16) bad(spec, "bits must be in [2, 16] (one of them is the sign)");
      levels = static_cast<int>((int64_t{1} << (bits - 1)) - 1);
    } else if (spec.has("levels")) {
      const int64_t l = spec.get_int("levels", 7);
      if (l < 1 || l > 32767) bad(spec, "levels must be in [1, 32767]");
      levels = static_cast<int>(l);
    }
    const int64_t bucket = spec.get_int("bucket", 512);
    if (bucket < 1 || bucket > (int64_t{1} << 30)) bad(spec, "bucket must be in [1, 2^30]");
    const std::string norm = spec.get_string("norm", "l2");
    if (norm != "l2" && norm != "max") bad(spec, "norm must be 'l2' or 'max', got '" + norm + "'");
    p.id = CodecId::kQsgd;
    p.levels = levels;
    p.bucket = bucket;
    p.max_norm = norm == "max";
  } else {
    throw SpecError("gradzip: unknown codec '" + spec.name + "' in spec '" + spec.str() + "'; valid codecs: " + names());
  }
  return p;
}

std::unique_ptr<Codec> make_codec(const Spec& spec) {
  const CodecParameters p = codec_parameters(spec);
  switch (p.id) {
    case CodecId::kIdentity: return make_identity_codec();
    case CodecId::kFp16: return make_fp16_codec();
    case CodecId::kBf16: return make_bf16_codec();
    case CodecId::kTopK: return make_topk_codec(p.density, p.approx);
    case CodecId::kRandomK: return make_randomk_codec(p.density, p.unbiased);
    case CodecId::kStc: return make_stc_codec(p.density, p.approx);
    case CodecId::kSign: return make_sign_codec(p.block);
    case CodecId::kQsgd: return make_qsgd_codec(p.levels, p.bucket, p.max_norm);
  }
  throw SpecError("gradzip: unknown codec '" + spec.name + "'");
}

std::unique_ptr<Codec> codec_for_payload(const uint8_t* data, size_t size) {
  // Decoders read every parameter from the payload: the default instance serves.
  switch (read_payload_header(data, size).codec) {
    case CodecId::kIdentity: return make_identity_codec();
    case CodecId::kFp16: return make_fp16_codec();
    case CodecId::kBf16: return make_bf16_codec();
    case CodecId::kTopK: return make_topk_codec(0.01, false);
    case CodecId::kRandomK: return make_randomk_codec(0.01, true);
    case CodecId::kStc: return make_stc_codec(0.01, false);
    case CodecId::kSign: return make_sign_codec(0);
    case CodecId::kQsgd: return make_qsgd_codec(7, 512, false);
  }
  throw PayloadError("gradzip: unknown codec id");  // read_payload_header already refused it
}

}  // namespace gradzip
