#include "gradzip/aggregation.h"

#include <algorithm>

#include "aggregate/compressed_allreduce.h"
#include "aggregate/exact_allreduce.h"
#include "aggregate/gossip.h"
#include "gradzip/codec.h"

namespace gradzip {
namespace {

std::string join(const std::vector<std::string>& items) {
  if (items.empty()) return "(none)";
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

const std::vector<AggregationKind>& aggregation_kinds() {
  static const std::vector<AggregationKind> kinds = [] {
    std::vector<AggregationKind> all = {
        {"allreduce", "exact all-reduce by the transport (Gloo for CPU, NCCL for CUDA)", {},
         [](const Spec& spec) -> std::unique_ptr<Aggregation> { return std::make_unique<ExactAllreduce>(spec); }},
    };
    // Every codec is also an aggregation: allgather its payloads, decode and reduce.
    for (const auto& codec : codec_kinds()) {
      std::vector<std::string> keys = codec.keys;
      keys.insert(keys.end(), compressed_aggregation_keys().begin(), compressed_aggregation_keys().end());
      all.push_back({codec.name, codec.summary, keys, [](const Spec& spec) -> std::unique_ptr<Aggregation> {
                       return std::make_unique<CompressedAllreduce>(spec);
                     }});
    }
    all.push_back({"gossip", "decentralized: each rank averages with its neighbours in the topology (D-PSGD)",
                   topology_keys(), [](const Spec& spec) -> std::unique_ptr<Aggregation> {
                     return std::make_unique<GossipAverage>(spec);
                   }});
    all.push_back({"choco", "decentralized, compressed: CHOCO-SGD gossip of codec-compressed differences",
                   choco_keys(), [](const Spec& spec) -> std::unique_ptr<Aggregation> {
                     return std::make_unique<ChocoGossip>(spec);
                   }});
    return all;
  }();
  return kinds;
}

const AggregationKind& find_aggregation_kind(const Spec& spec) {
  const auto& kinds = aggregation_kinds();
  auto kind = std::find_if(kinds.begin(), kinds.end(),
                           [&](const AggregationKind& k) { return k.name == spec.name; });
  if (kind == kinds.end()) {
    std::vector<std::string> names;
    for (const auto& k : kinds) names.push_back(k.name);
    throw SpecError("gradzip: unknown aggregation '" + spec.name + "' in spec '" + spec.str() +
                    "'; valid names: " + join(names));
  }
  for (const auto& [key, value] : spec.params) {
    if (std::find(kind->keys.begin(), kind->keys.end(), key) == kind->keys.end()) {
      throw SpecError("gradzip: unknown key '" + key + "' for aggregation '" + spec.name +
                      "' in spec '" + spec.str() + "'; valid keys: " + join(kind->keys));
    }
  }
  return *kind;
}

std::unique_ptr<Aggregation> make_aggregation(const Spec& spec) {
  return find_aggregation_kind(spec).make(spec);
}

}  // namespace gradzip
