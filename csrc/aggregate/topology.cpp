#include "gradzip/topology.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace gradzip {
namespace {

using Graph = std::vector<std::set<int>>;  // undirected adjacency, self excluded

[[noreturn]] void fail(const std::string& name, int size, const std::string& why) {
  throw SpecError("gradzip: topology '" + name + "' over " + std::to_string(size) + " ranks: " + why);
}

void connect(Graph& g, int a, int b) {
  if (a == b) return;
  g[a].insert(b);
  g[b].insert(a);
}

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

int log2_exact(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

Graph explicit_graph(const std::string& edges, int size) {
  if (edges.empty()) fail("explicit", size, "give its undirected edges, e.g. edges=0-1;1-2;2-3;3-0");
  Graph g(size);
  size_t start = 0;
  while (start <= edges.size()) {
    const size_t end = std::min(edges.find(';', start), edges.size());
    const std::string edge = edges.substr(start, end - start);
    const size_t dash = edge.find('-');
    int a = -1, b = -1;
    try {
      size_t used_a = 0, used_b = 0;
      if (dash != std::string::npos) {
        a = std::stoi(edge.substr(0, dash), &used_a);
        b = std::stoi(edge.substr(dash + 1), &used_b);
      }
      if (dash == std::string::npos || used_a != dash || used_b != edge.size() - dash - 1) a = -1;
    } catch (const std::exception&) {
      a = -1;
    }
    if (a < 0 || b < 0) fail("explicit", size, "the edge '" + edge + "' is not rank-rank (e.g. 0-1)");
    if (a >= size || b >= size) fail("explicit", size, "the edge '" + edge + "' names a rank >= the group size");
    if (a == b) fail("explicit", size, "the edge '" + edge + "' is a self-loop");
    connect(g, a, b);
    start = end + 1;
  }
  return g;
}

// The graph of each phase of the topology (one phase unless it changes with the step).
std::vector<Graph> graphs(const std::string& name, int size, const std::string& edges) {
  if (name != "explicit" && !edges.empty()) fail(name, size, "edges are only for topology=explicit");
  Graph g(size);
  if (name == "ring") {
    for (int i = 0; i < size; ++i) connect(g, i, (i + 1) % size);
  } else if (name == "torus") {
    int rows = static_cast<int>(std::sqrt(static_cast<double>(size)));
    while (rows > 1 && size % rows != 0) --rows;
    if (rows < 2) fail(name, size, "a 2-D torus needs a size that factors as rows x cols with rows, cols >= 2");
    const int cols = size / rows;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        connect(g, r * cols + c, r * cols + (c + 1) % cols);
        connect(g, r * cols + c, ((r + 1) % rows) * cols + c);
      }
    }
  } else if (name == "exp") {
    for (int i = 0; i < size; ++i) {
      for (int hop = 1; hop < size; hop *= 2) connect(g, i, (i + hop) % size);
    }
  } else if (name == "onepeer") {
    if (!power_of_two(size)) fail(name, size, "the one-peer exponential graph needs a power-of-two size");
    std::vector<Graph> phases;
    for (int k = 0; k < std::max(1, log2_exact(size)); ++k) {
      Graph p(size);
      for (int i = 0; i < size && size > 1; ++i) connect(p, i, i ^ (1 << k));
      phases.push_back(std::move(p));
    }
    return phases;
  } else if (name == "complete") {
    for (int i = 0; i < size; ++i) {
      for (int j = i + 1; j < size; ++j) connect(g, i, j);
    }
  } else if (name == "explicit") {
    g = explicit_graph(edges, size);
  } else {
    std::string names;
    for (const auto& n : Topology::names()) names += (names.empty() ? "" : ", ") + n;
    throw SpecError("gradzip: unknown topology '" + name + "'; valid topologies: " + names);
  }
  return {g};
}

bool connected(const std::vector<Graph>& phases, int size) {
  std::vector<bool> seen(size, false);
  std::vector<int> todo = {0};
  seen[0] = true;
  while (!todo.empty()) {
    const int i = todo.back();
    todo.pop_back();
    for (const auto& g : phases) {
      for (int j : g[i]) {
        if (!seen[j]) {
          seen[j] = true;
          todo.push_back(j);
        }
      }
    }
  }
  return std::all_of(seen.begin(), seen.end(), [](bool s) { return s; });
}

}  // namespace

const std::vector<std::string>& Topology::names() {
  static const std::vector<std::string> names = {"ring", "torus", "exp", "onepeer", "complete", "explicit"};
  return names;
}

Topology Topology::from_spec(const Spec& spec, int size) {
  return Topology(spec.get_string("topology"), size, spec.get_string("weights"),
                  spec.get_string("edges", ""));
}

Topology::Topology(const std::string& name, int size, const std::string& weights, const std::string& edges)
    : name_(name), size_(size) {
  if (size < 1) fail(name, size, "the group size must be >= 1");
  if (weights != "mh" && weights != "uniform") {
    fail(name, size, "weights must be 'mh' (Metropolis-Hastings) or 'uniform', got '" + weights + "'");
  }
  const auto phase_graphs = graphs(name, size, edges);
  if (!connected(phase_graphs, size)) fail(name, size, "the graph is not connected: its ranks never reach consensus");
  for (const Graph& g : phase_graphs) {
    size_t max_degree = 0;
    for (const auto& adjacent : g) max_degree = std::max(max_degree, adjacent.size());
    Phase phase;
    for (int i = 0; i < size; ++i) {
      std::vector<Neighbour> mine;
      double total = 0;
      for (int j : g[i]) {
        const size_t degree = weights == "mh" ? std::max(g[i].size(), g[j].size()) : max_degree;
        mine.push_back({j, 1.0 / (1.0 + static_cast<double>(degree))});
        total += mine.back().weight;
      }
      phase.neighbours.push_back(std::move(mine));
      phase.self_weight.push_back(1.0 - total);
    }
    phases_.push_back(std::move(phase));
  }
  // Both weightings are symmetric and doubly stochastic by construction; check it, since
  // conservation of the sum and convergence rest on it.
  for (int p = 0; p < period(); ++p) {
    const auto w = mixing_matrix(p);
    for (int i = 0; i < size; ++i) {
      double row = 0;
      for (int j = 0; j < size; ++j) {
        if (w[i * size + j] < 0 || w[i * size + j] != w[j * size + i]) {
          fail(name, size, "the mixing matrix is not symmetric and non-negative");
        }
        row += w[i * size + j];
      }
      if (std::abs(row - 1.0) > 1e-12) fail(name, size, "the mixing matrix is not doubly stochastic");
    }
  }
}

const std::vector<Neighbour>& Topology::neighbours(int rank, uint64_t step) const {
  return phase(step).neighbours.at(rank);
}

double Topology::self_weight(int rank, uint64_t step) const { return phase(step).self_weight.at(rank); }

std::vector<double> Topology::mixing_matrix(uint64_t step) const {
  std::vector<double> w(static_cast<size_t>(size_) * size_, 0.0);
  const Phase& p = phase(step);
  for (int i = 0; i < size_; ++i) {
    w[i * size_ + i] = p.self_weight[i];
    for (const auto& n : p.neighbours[i]) w[i * size_ + n.rank] = n.weight;
  }
  return w;
}

double Topology::consensus_rate() const {
  // X - mean contracts by ||P - J/n||_2 per period, P the product of the period's W.
  at::Tensor product = at::eye(size_, at::kDouble);
  for (int p = 0; p < period(); ++p) {
    auto w = mixing_matrix(p);
    product = at::from_blob(w.data(), {size_, size_}, at::kDouble).matmul(product);
  }
  product -= 1.0 / size_;
  return at::linalg_svdvals(product).max().item<double>();
}

}  // namespace gradzip
