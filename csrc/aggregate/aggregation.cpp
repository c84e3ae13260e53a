// The aggregation registry, and binding a spec against it (gradzip/bound_spec.h).
#include "gradzip/aggregation.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>

#include "aggregate/compressed_allreduce.h"
#include "aggregate/exact_allreduce.h"
#include "aggregate/gossip.h"
#include "codec/codec_record.h"

namespace gradzip {
namespace {

std::string join(const std::vector<std::string>& items) {
  if (items.empty()) return "(none)";
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

const SpecKey* find_key(const std::vector<SpecKey>& keys, const std::string& name) {
  auto it = std::find_if(keys.begin(), keys.end(), [&](const SpecKey& k) { return k.name == name; });
  return it == keys.end() ? nullptr : &*it;
}

// The keys a codec lends an aggregation: all of them, except for choco vote (its public
// copies need the decoded values, not a vote), density_warmup and momentum (they concern
// all-reduce calls of gradients; choco's copies follow one codec).
std::vector<SpecKey> lent_keys(const CodecRecord& codec, AggregationKind::CodecFrom from) {
  std::vector<SpecKey> keys;
  for (const auto& key : codec.keys) {
    const bool all_reduce_only = key.name == "vote" || key.name == "density_warmup" || key.name == "momentum";
    if (!(from == AggregationKind::CodecFrom::kCompressKey && all_reduce_only)) keys.push_back(key);
  }
  return keys;
}

const AggregationKind& find_kind(const Spec& spec) {
  const auto& kinds = aggregation_kinds();
  auto kind = std::find_if(kinds.begin(), kinds.end(), [&](const AggregationKind& k) { return k.name == spec.name; });
  if (kind == kinds.end()) {
    refuse_absent_codec(spec.name);
    std::vector<std::string> names;
    for (const auto& k : kinds) names.push_back(k.name);
    throw SpecError("gradzip: unknown aggregation '" + spec.name + "' in spec '" + spec.str() +
                    "'; valid names: " + join(names));
  }
  return *kind;
}

// The kinds: exact, one per registered codec, the decentralized ones.
std::vector<AggregationKind> every_kind() {
  using Kind = AggregationKind;
  std::vector<Kind> all = {{.name = "allreduce",
                            .summary = "exact all-reduce by the transport (Gloo for CPU, NCCL for CUDA)",
                            .keys = {},
                            .check = {},
                            .make = [](const BoundSpec& spec) -> std::unique_ptr<Aggregation> {
                              return std::make_unique<ExactAllreduce>(spec);
                            }}};
  // Every codec is also an aggregation: its payloads exchanged, decoded and reduced.
  for (const auto* codec : codec_records()) {
    all.push_back({.name = codec->name,
                   .summary = codec->summary,
                   .keys = compressed_aggregation_keys(),
                   .codec_from = Kind::CodecFrom::kName,
                   .check = check_compressed_spec,
                   .make = [](const BoundSpec& spec) -> std::unique_ptr<Aggregation> {
                     return std::make_unique<CompressedAllreduce>(spec);
                   }});
  }
  all.push_back({.name = "gossip",
                 .summary = "decentralized: each rank averages with its neighbours in the topology (D-PSGD)",
                 .keys = topology_keys(),
                 .decentralized = true,
                 .check = [](const BoundSpec& spec) { check_topology_spec(spec.spec()); },
                 .make = [](const BoundSpec& spec) -> std::unique_ptr<Aggregation> {
                   return std::make_unique<GossipAverage>(spec);
                 }});
  all.push_back({.name = "choco",
                 .summary = "decentralized, compressed: CHOCO-SGD gossip of codec-compressed differences",
                 .keys = choco_keys(),
                 .codec_from = Kind::CodecFrom::kCompressKey,
                 .decentralized = true,
                 .check = [](const BoundSpec& spec) { check_choco_spec(spec.spec()); },
                 .make = [](const BoundSpec& spec) -> std::unique_ptr<Aggregation> {
                   return std::make_unique<ChocoGossip>(spec);
                 }});
  return all;
}

}  // namespace

const std::vector<AggregationKind>& aggregation_kinds() {
  // Built again when a codec was registered since (register_codec); the lists built
  // before stay, for the BoundSpecs that point into them.
  static std::mutex mutex;
  static std::vector<std::pair<size_t, std::unique_ptr<const std::vector<AggregationKind>>>> lists;
  const std::lock_guard lock(mutex);
  const size_t codecs = codec_records().size();
  if (lists.empty() || lists.back().first != codecs) {
    lists.emplace_back(codecs, std::make_unique<const std::vector<AggregationKind>>(every_kind()));
  }
  return *lists.back().second;
}

std::vector<SpecKey> all_keys(const AggregationKind& kind) {
  std::vector<SpecKey> keys = kind.keys;
  if (kind.codec_from == AggregationKind::CodecFrom::kNone) return keys;
  for (const auto* codec : codec_records()) {
    if (kind.codec_from == AggregationKind::CodecFrom::kName && codec->name != kind.name) continue;
    for (const auto& key : lent_keys(*codec, kind.codec_from)) {
      if (!find_key(keys, key.name)) keys.push_back(key);
    }
  }
  return keys;
}

BoundSpec::BoundSpec(std::string_view text) : spec_(parse_spec(text)), kind_(&find_kind(spec_)) {
  fill_defaults(spec_, kind_->keys);
  const CodecRecord* codec = nullptr;
  if (kind_->codec_from == AggregationKind::CodecFrom::kName) codec = find_codec_record(spec_.name);
  if (kind_->codec_from == AggregationKind::CodecFrom::kCompressKey) {
    refuse_absent_codec(spec_.get_string("compress", ""));
    find_key(kind_->keys, "compress")->check(spec_);
    codec = find_codec_record(spec_.get_string("compress"));
  }
  const std::vector<SpecKey> codec_keys = codec ? lent_keys(*codec, kind_->codec_from) : std::vector<SpecKey>{};
  for (const auto& [key, value] : spec_.params) {
    if (const SpecKey* own = find_key(kind_->keys, key)) {
      own->check(spec_);
    } else if (const SpecKey* lent = find_key(codec_keys, key)) {
      lent->check(spec_);
      codec_spec_.params.emplace(key, value);
    } else {
      std::vector<std::string> names;
      for (const auto& k : kind_->keys) names.push_back(k.name);
      for (const auto& k : codec_keys) names.push_back(k.name);
      const std::string what = kind_->codec_from == AggregationKind::CodecFrom::kCompressKey
                                   ? "aggregation '" + spec_.name + "' with compress=" + codec->name
                                   : "aggregation '" + spec_.name + "'";
      throw SpecError("gradzip: unknown key '" + key + "' for " + what + " in spec '" + spec_.str() +
                      "'; valid keys: " + join(names));
    }
  }
  fill_defaults(spec_, codec_keys);
  if (codec) {
    codec_spec_.name = codec->name;
    fill_defaults(codec_spec_, codec_keys);
    // The codec reads only its own keys, with every default of its table (also those it
    // does not lend); given the whole spec, its errors name the spec as the user wrote it.
    codec_ = codec->build(spec_);
  }
  if (kind_->check) kind_->check(*this);
}

bool BoundSpec::error_feedback() const { return codec_ && spec_.get_bool("ef", codec_->biased()); }

bool BoundSpec::decentralized() const { return kind_->decentralized; }

c10::intrusive_ptr<c10d::Work> Aggregation::allreduce_pieces(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts,
                                                             const c10::intrusive_ptr<c10d::Backend>& transport,
                                                             Stats& stats, const std::vector<TensorPiece>& pieces) {
  std::string key;
  for (const auto& piece : pieces) key += (key.empty() ? "" : "+") + piece.key;
  return allreduce(tensors, opts, transport, stats, key);
}

c10::intrusive_ptr<c10d::Work> Aggregation::reduce_scatter(at::Tensor& output, at::Tensor& input,
                                                           const c10d::ReduceScatterOptions& opts,
                                                           const c10::intrusive_ptr<c10d::Backend>& transport,
                                                           Stats& stats, const std::string&) {
  return exact_reduce_scatter(output, input, opts, transport, stats);
}

c10::intrusive_ptr<c10d::Work> Aggregation::reduce_scatter_pieces(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts,
                                                                  const c10::intrusive_ptr<c10d::Backend>& transport,
                                                                  Stats& stats, const std::string& key,
                                                                  const std::vector<TensorPiece>&) {
  return reduce_scatter(output, input, opts, transport, stats, key);
}

void Aggregation::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  if (!state.empty()) {
    throw std::invalid_argument("gradzip: aggregation '" + spec_.str() + "' keeps no state, but the state to load has " +
                                std::to_string(state.size()) + " entries (" + state.begin()->first + ", ...)");
  }
}

std::unique_ptr<Aggregation> make_aggregation(const BoundSpec& spec) { return spec.kind().make(spec); }

}  // namespace gradzip
