// Topology: who gossips with whom, and with which weights.
//
// A topology is a graph over the ranks 0..size-1 with a mixing matrix W: w_ij > 0 on the
// edges, w_ii = 1 - sum_j w_ij, zero elsewhere. Construction checks that every W is
// symmetric and doubly stochastic and that the graph is connected, so a gossip step
// conserves the sum over ranks and repeated steps reach consensus. Errors are SpecErrors
// that name the problem.
//
// Graphs (name: edges of rank i):
//   ring      i-1, i+1 (mod size)
//   torus     a rows x cols grid wrapped at both ends, rows the largest divisor of size
//             that is at most sqrt(size) (size must factor: rows >= 2)
//   exp       static exponential graph: i +- 2^k (mod size) for 2^k < size
//   onepeer   one-peer exponential graph, changing with the step: at step t, i ^ 2^(t mod
//             log2 size) (size a power of two); it reaches the exact average in log2 size steps
//   complete  every other rank
//   explicit  the undirected edges given as "a-b;c-d;..."
// Weights: "mh" (Metropolis-Hastings, the default): w_ij = 1 / (1 + max(deg_i, deg_j));
// "uniform": w_ij = 1 / (1 + max degree of the graph).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradzip/spec.h"

namespace gradzip {

struct Neighbour {
  int rank;
  double weight;
};

class Topology {
 public:
  Topology(const std::string& name, int size, const std::string& weights = "mh", const std::string& edges = "");
  // From a spec's keys: topology (default "exp"), weights (default "mh"), edges (explicit only).
  static Topology from_spec(const Spec& spec, int size);
  // The graph names, in the order error messages list them.
  static const std::vector<std::string>& names();

  const std::string& name() const { return name_; }
  int size() const { return size_; }
  // Steps after which the graph repeats: 1 for static graphs, log2 size for onepeer.
  int period() const { return static_cast<int>(phases_.size()); }

  // The neighbours of `rank` at `step`, ascending by rank, self excluded.
  const std::vector<Neighbour>& neighbours(int rank, uint64_t step) const;
  // w_ii of `rank` at `step`.
  double self_weight(int rank, uint64_t step) const;
  // W at `step`, size x size, row-major.
  std::vector<double> mixing_matrix(uint64_t step) const;
  // rho: the largest |eigenvalue| of the product of W over one period, the eigenvalue 1 of
  // the consensus direction excluded. The distance to consensus shrinks at least by rho
  // per period: ||X_t - mean|| <= rho^(t/period) ||X_0 - mean||.
  double consensus_rate() const;
  // 1 - consensus_rate(): the larger, the faster consensus (0 < gap <= 1).
  double spectral_gap() const { return 1.0 - consensus_rate(); }

 private:
  struct Phase {
    std::vector<std::vector<Neighbour>> neighbours;  // by rank
    std::vector<double> self_weight;                 // by rank
  };
  const Phase& phase(uint64_t step) const { return phases_[step % phases_.size()]; }

  std::string name_;
  int size_;
  std::vector<Phase> phases_;
};

}  // namespace gradzip
