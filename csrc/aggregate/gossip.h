// Decentralized aggregations: each rank talks only to its neighbours in a Topology
// (gradzip/topology.h) and ends with a weighted neighbour average, not the global one.
//
//   gossip   (D-PSGD)    x_i <- sum_j w_ij x_j, over the step's neighbours j and i itself.
//   choco    (CHOCO-SGD) each rank keeps public copies x^ of itself and its neighbours;
//            it sends q_i = Q(x_i - x^_i) through a codec (gradzip/codec.h), every holder
//            of a copy adds the decoded q to it, then x_i += gamma sum_j w_ij (x^_j - x^_i).
//
// Both conserve the sum over ranks (W is doubly stochastic) up to float rounding. Terms
// are summed in ascending rank order, so results are identical from run to run, and two
// ranks with the same weights (onepeer) end bitwise equal. The step of the topology is
// the number of calls for the key so far; peers check that they agree on it, on the dtype
// and on the element count, and raise naming both ranks when they do not.
//
// Inf and NaN: gossip averages them in like any value (its neighbours' results turn
// non-finite too; it keeps no state but the call count). In choco a rank whose input
// holds Inf or NaN sends no q (its message is marked non-finite): no holder changes its
// copy of that rank, and its result and its neighbours' are all NaN this step.
//
// Floating tensors with AVG are averaged; SUM returns size x the average (an estimate of
// the sum). Other dtypes and ops go through the transport's exact all-reduce.
// gossip computes in the tensor's dtype (fp32 for fp16/bf16); choco keeps its copies in
// fp32 on the CPU. The topology's size is the transport's.
#pragma once

#include <map>

#include "aggregate/stateful_aggregation.h"
#include "gradzip/codec.h"
#include "gradzip/topology.h"

namespace gradzip {

// A Topology per group size, built from the spec on first use.
class TopologyCache {
 public:
  explicit TopologyCache(Spec spec) : spec_(std::move(spec)) {}
  const Topology& get(int size);

 private:
  Spec spec_;
  std::mutex mutex_;
  std::map<int, Topology> topologies_;
};

// gossip's state per tensor: the calls so far (a time-varying graph's step).
struct GossipState {
  int64_t calls = 0;
  void save(const std::string& key, std::map<std::string, at::Tensor>& out) const;
  void load(const std::string& field, const at::Tensor& value, const std::string& name);
};

// choco's: the calls, and the fp32 public copies x^ of this rank and its neighbours.
struct ChocoState {
  int64_t calls = 0;
  std::map<int, at::Tensor> public_copies;
  void save(const std::string& key, std::map<std::string, at::Tensor>& out) const;
  void load(const std::string& field, const at::Tensor& value, const std::string& name);
};

class GossipAverage final : public StatefulAggregation<GossipState> {
 public:
  explicit GossipAverage(const BoundSpec& spec);

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                           const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                           const std::string& key, std::optional<bool> all_finite) override;

 private:
  TopologyCache topologies_;
};

class ChocoGossip final : public StatefulAggregation<ChocoState> {
 public:
  explicit ChocoGossip(const BoundSpec& spec);

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                           const c10::intrusive_ptr<c10d::Backend>& transport, Stats& stats,
                                           const std::string& key, std::optional<bool> all_finite) override;

 private:
  TopologyCache topologies_;
  std::shared_ptr<const Codec> codec_;
  double gamma_;
  uint64_t seed_;
};

// The spec keys of the graph (topology, weights, edges) and the rules between them.
std::vector<SpecKey> topology_keys();
void check_topology_spec(const Spec& spec);
// choco's own keys: the graph's, compress, gamma, seed (the codec's come from its record).
std::vector<SpecKey> choco_keys();
void check_choco_spec(const Spec& spec);

}  // namespace gradzip
