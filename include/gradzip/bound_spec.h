// BoundSpec: a spec string parsed and checked once, against the aggregation registry
// (gradzip/aggregation.h) and the codec registry: its name, every key and every value.
// It splits the keys into the aggregation's own and its codec's, and holds the codec
// built from them. Every door (the backend, the DDP hook, gradzip.Aggregation,
// gradzip.codec) takes a BoundSpec, so no layer parses the string again and the same
// string means the same thing everywhere. Python knows it as gradzip.Spec (the parsed
// text without a binding is gradzip/spec.h's Spec, which Python never sees).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "gradzip/codec.h"
#include "gradzip/spec.h"

namespace gradzip {

struct AggregationKind;

class BoundSpec {
 public:
  // Throws SpecError naming what is wrong and listing what is valid.
  explicit BoundSpec(std::string_view text);

  const Spec& spec() const { return spec_; }
  std::string str() const { return spec_.str(); }  // canonical: keys sorted
  const std::string& name() const { return spec_.name; }
  const AggregationKind& kind() const { return *kind_; }
  // Decentralized gossip (each rank ends with a neighbour average, not the global one).
  bool decentralized() const;
  // The codec's part of the spec (its name and its keys alone) and the codec built from
  // it; null for aggregations without a codec (allreduce, gossip).
  const Spec& codec_spec() const { return codec_spec_; }
  const std::shared_ptr<const Codec>& codec() const { return codec_; }
  // Error feedback: the spec's `ef`, else the codec's default (on for the biased codecs:
  // topk, stc, sign with vote=mean); false without a codec. Every door reads it here.
  bool error_feedback() const;

 private:
  Spec spec_;
  const AggregationKind* kind_;
  Spec codec_spec_;
  std::shared_ptr<const Codec> codec_;
};

}  // namespace gradzip
