// Aggregation: how a gradzip process group all-reduces a tensor.
//
// An Aggregation is made from a Spec (gradzip/spec.h) by make_aggregation(), which
// rejects an unknown name or key with a message listing the valid ones. It reduces
// a tensor in place over a transport (a c10d::Backend such as Gloo or NCCL) and
// promises that every rank ends with a bitwise-identical result. It does not know
// whether the call came from the backend or from a DDP comm hook.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "gradzip/spec.h"
#include "gradzip/stats.h"

namespace gradzip {

// What an aggregation keeps for one logical tensor between calls.
struct TensorState {
  std::vector<float> residual;  // error feedback: what was not sent yet (empty when off)
  // The residual of a CUDA tensor, kept on its device between calls (then `residual` is
  // empty); state() and tensor_state() hand it out as `residual`, on the host.
  at::Tensor device_residual;
  int64_t calls = 0;            // all-reduces of this tensor so far, exact ones included
  uint64_t step = 0;            // compressed encodes so far: seeds the codec's random draws
  // CHOCO gossip: the public copies x^ of this rank and of its neighbours, by rank.
  std::map<int, std::vector<float>> public_copies;
};

class Aggregation {
 public:
  explicit Aggregation(Spec spec) : spec_(std::move(spec)) {}
  virtual ~Aggregation() = default;
  Aggregation(const Aggregation&) = delete;
  Aggregation& operator=(const Aggregation&) = delete;

  const Spec& spec() const { return spec_; }

  // Reduces `tensors` (c10d's one-tensor list) in place across every rank of
  // `transport` with opts.reduceOp, and adds the bytes it moves to `stats`. `key`
  // names the logical tensor whose state (error feedback) this call uses; every
  // rank must pass the same key. The returned Work completes when the result is in
  // place; its future holds the tensor list, as c10d's allreduce does.
  virtual c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
      const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats, const std::string& key) = 0;

  // The per-tensor state by key, to save; load_state() restores it exactly.
  virtual std::map<std::string, TensorState> state() const { return {}; }
  virtual void load_state(std::map<std::string, TensorState> state) {}
  // One key's state (empty when unknown), and its replacement.
  virtual TensorState tensor_state(const std::string& key) const { return {}; }
  virtual void set_tensor_state(const std::string& key, TensorState state) {}

 private:
  Spec spec_;
};

// One registered kind of aggregation: its spec name, what it does, its valid keys.
struct AggregationKind {
  std::string name;
  std::string summary;
  std::vector<std::string> keys;
  std::function<std::unique_ptr<Aggregation>(const Spec&)> make;
};

// Every registered kind, in the order they are listed in error messages.
const std::vector<AggregationKind>& aggregation_kinds();

// Checks the spec's name and keys against the registry; throws SpecError listing
// the valid names (or the valid keys of that name) when one is unknown.
const AggregationKind& find_aggregation_kind(const Spec& spec);

// find_aggregation_kind(spec).make(spec): also checks the values of the keys.
std::unique_ptr<Aggregation> make_aggregation(const Spec& spec);

}  // namespace gradzip
