// The spec keys every compressed aggregation takes besides its codec's (names, defaults,
// ranges, help text); the rules between them, checked when a spec is bound; and what a
// bound spec's keys answer for the layers above (hierarchy, layers, reduce_scatter).
#include "aggregate/compressed_spec_keys.h"

#include <algorithm>
#include <string>

#include "aggregate/compressed_allreduce.h"

namespace gradzip {

std::string layers_of(const BoundSpec& spec) {
  const std::string layers = spec.spec().get_string("layers");
  if (layers != "auto") return layers;
  if (has_levels(*spec.codec())) return "adapt";
  return spec.codec()->per_parameter_by_default() ? "on" : "off";
}

void check_compressed_spec(const BoundSpec& spec) {
  if (spec.spec().get_double("momentum", 0.0) > 0 && !spec.error_feedback()) {
    throw SpecError("gradzip: spec '" + spec.str() +
                    "': momentum correction keeps what was not sent in the residual; it needs ef=1");
  }
  if (layers_of(spec) == "adapt" && !has_levels(*spec.codec())) {
    throw SpecError("gradzip: spec '" + spec.str() + "': layers=adapt chooses each layer's density (topk, randomk, " +
                    "stc) or levels (qsgd); codec '" + spec.codec()->name() + "' has neither");
  }
  if (spec.spec().get_double("budget") > 0 && layers_of(spec) != "adapt") {
    throw SpecError("gradzip: spec '" + spec.str() + "': budget sets the bytes layers=adapt chooses levels under; " +
                    "this spec's layers is " + layers_of(spec));
  }
}

namespace {

bool takes_key(const BoundSpec& spec, const char* name) {
  const auto& keys = spec.kind().keys;
  return std::any_of(keys.begin(), keys.end(), [&](const SpecKey& k) { return k.name == name; });
}

// The `exchange` key: auto or a scheme's name, its help from the schemes' records.
SpecKey exchange_key() {
  std::vector<std::string> choices = {"auto"};
  std::string how;
  for (const ExchangeScheme* scheme : exchange_schemes()) {
    choices.push_back(scheme->name);
    how += scheme->name + " (" + scheme->summary + "), ";
  }
  return SpecKey::choice("exchange", "auto", choices,
                         "how payloads travel: " + how +
                             "auto (the fewest bytes, dense when compression would send more than a ring; a scheme "
                             "that compresses twice only for codecs that re-encode losslessly: identity, fp16, bf16)");
}

}  // namespace

bool uses_node_levels(const BoundSpec& spec) {
  return takes_key(spec, "hierarchy") && spec.spec().get_string("hierarchy") == "auto" &&
         !spec.codec()->votes() && spec.spec().get_double("momentum", 0.0) == 0;
}

bool compresses_by_layers(const BoundSpec& spec) { return takes_key(spec, "layers") && layers_of(spec) != "off"; }

bool compresses_reduce_scatter(const BoundSpec& spec) {
  return takes_key(spec, "reduce_scatter") && spec.spec().get_string("reduce_scatter") == "compressed";
}

std::vector<SpecKey> compressed_aggregation_keys() {
  return {SpecKey::boolean("ef", "",
                           "error feedback: add what earlier steps did not send, keep what this step does not send "
                           "(default: on for topk, stc, sign with vote=mean; off otherwise)"),
          exchange_key(),
          SpecKey::choice("layers", "auto", {"auto", "off", "on", "adapt"},
                          "on a tensor made of named parameters (the DDP hook with model=, the FSDP door's "
                          "shards): on compresses each parameter by itself (top-k's selection, sign's blocks, "
                          "QSGD's buckets within it) and sends parameters under 1024 elements exact (CPU tensors); adapt as on, each parameter "
                          "at the density (levels) of ×1/8..×8 the spec's that minimises the bucket's compression "
                          "error within the bytes of the spec's everywhere, agreed by all ranks every adapt_every "
                          "calls; off: the bucket as one tensor; auto: adapt for topk, randomk, stc and qsgd, on "
                          "for sign, off for the rest"),
          SpecKey::integer("adapt_every", "100", 1, 9.2e18,
                           "layers=adapt: calls of a bucket between two choices of its parameters' levels"),
          SpecKey::number("budget", "0", 0.0, 1.0,
                          "layers=adapt: the bytes the adapted parameters may send, as a fraction of their fp32 "
                          "bytes (0.01: 1%); the levels may then all move away from the spec's (0: the bytes of "
                          "the spec's level everywhere)"),
          SpecKey::choice("hierarchy", "auto", {"auto", "off"},
                          "over ranks in several nodes of several ranks each (gradzip.node_layout): auto reduces "
                          "exactly inside each node and compresses only across the nodes, each local rank one "
                          "shard (not with vote=majority or momentum); off: every rank a peer"),
          SpecKey::integer("rounds", "0", 0, kMaxRounds * 8,
                           "every exchange in this many pipelined rounds: two-phase and the compressed "
                           "reduce-scatter cut each chunk into as many sub-pieces, one-shot the vector into as "
                           "many pieces; the transport moves one round while the next is encoded (0: two-phase "
                           "one round per 4 MiB a rank sends in the first phase, one-shot one per 512 KiB of its "
                           "payload; at most 8)"),
          SpecKey::choice("reduce_scatter", "exact", {"exact", "compressed"},
                          "the gradzip backend's reduce_scatter_tensor (FSDP's gradients): exact, or compressed "
                          "with this codec and error feedback like all_reduce"),
          SpecKey::integer("min_numel", "0", 0, 9.2e18, "tensors with fewer elements go exact"),
          SpecKey::integer("warmup", "0", 0, 9.2e18, "the first warmup calls of each tensor (all-reduces, reduce-scatters) go exact"),
          SpecKey::integer("seed", "0", 0, 9.2e18,
                           "seeds random-k's choice and QSGD's stochastic rounding (with the step and the rank)")};
}

}  // namespace gradzip
