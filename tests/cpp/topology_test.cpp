#include "gradzip/topology.h"

#include <gtest/gtest.h>

#include <cmath>

#include "gradzip/aggregation.h"

namespace gradzip {
namespace {

std::string error_of(const std::function<void()>& make) {
  try {
    make();
  } catch (const SpecError& e) {
    return e.what();
  }
  return "";
}

bool valid_size(const std::string& name, int size) {
  if (name == "onepeer") return (size & (size - 1)) == 0;
  if (name == "torus") {
    for (int rows = 2; rows * rows <= size; ++rows) {
      if (size % rows == 0) return true;
    }
    return false;
  }
  return true;
}

TEST(TopologyTest, EveryMixingMatrixIsSymmetricDoublyStochasticAndConnected) {
  for (const std::string name : {"ring", "torus", "exp", "onepeer", "complete"}) {
    for (const std::string weights : {"mh", "uniform"}) {
      for (int size = 1; size <= 17; ++size) {
        if (!valid_size(name, size)) continue;
        const Topology t(name, size, weights);
        for (int step = 0; step < t.period(); ++step) {
          const auto w = t.mixing_matrix(step);
          for (int i = 0; i < size; ++i) {
            double row = 0, column = 0;
            for (int j = 0; j < size; ++j) {
              EXPECT_EQ(w[i * size + j], w[j * size + i]) << name << " " << size;
              EXPECT_GE(w[i * size + j], 0.0);
              row += w[i * size + j];
              column += w[j * size + i];
            }
            EXPECT_NEAR(row, 1.0, 1e-12) << name << " " << size;
            EXPECT_NEAR(column, 1.0, 1e-12) << name << " " << size;
            // neighbours() and mixing_matrix() agree, ascending, self excluded.
            int previous = -1;
            for (const auto& n : t.neighbours(i, step)) {
              EXPECT_GT(n.rank, previous);
              EXPECT_NE(n.rank, i);
              EXPECT_EQ(n.weight, w[i * size + n.rank]);
              previous = n.rank;
            }
            EXPECT_EQ(t.self_weight(i, step), w[i * size + i]);
          }
        }
        const double gap = t.spectral_gap();
        EXPECT_GT(gap, 0.0) << name << " " << size;
        EXPECT_LE(gap, 1.0 + 1e-12) << name << " " << size;
      }
    }
  }
}

TEST(TopologyTest, NeighboursOfEachGraph) {
  auto ranks = [](const Topology& t, int rank, int step = 0) {
    std::vector<int> out;
    for (const auto& n : t.neighbours(rank, step)) out.push_back(n.rank);
    return out;
  };
  EXPECT_EQ(ranks(Topology("ring", 8), 0), (std::vector<int>{1, 7}));
  EXPECT_EQ(ranks(Topology("exp", 8), 0), (std::vector<int>{1, 2, 4, 6, 7}));
  EXPECT_EQ(ranks(Topology("torus", 12), 5), (std::vector<int>{1, 4, 6, 9}));  // 3 x 4
  EXPECT_EQ(ranks(Topology("onepeer", 8), 5, 0), (std::vector<int>{4}));
  EXPECT_EQ(ranks(Topology("onepeer", 8), 5, 1), (std::vector<int>{7}));
  EXPECT_EQ(ranks(Topology("onepeer", 8), 5, 2), (std::vector<int>{1}));
  EXPECT_EQ(ranks(Topology("onepeer", 8), 5, 3), (std::vector<int>{4}));
  EXPECT_EQ(ranks(Topology("complete", 4), 2), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(ranks(Topology("explicit", 4, "mh", "0-1;1-2;2-3"), 1), (std::vector<int>{0, 2}));
}

TEST(TopologyTest, MetropolisHastingsAndUniformWeights) {
  // A path 0-1-2-3: degrees 1, 2, 2, 1.
  const Topology mh("explicit", 4, "mh", "0-1;1-2;2-3");
  EXPECT_DOUBLE_EQ(mh.neighbours(0, 0)[0].weight, 1.0 / 3);
  EXPECT_DOUBLE_EQ(mh.self_weight(0, 0), 2.0 / 3);
  EXPECT_DOUBLE_EQ(mh.self_weight(1, 0), 1.0 / 3);
  const Topology uniform("explicit", 4, "uniform", "0-1;1-2;2-3");
  EXPECT_DOUBLE_EQ(uniform.neighbours(0, 0)[0].weight, 1.0 / 3);
  EXPECT_DOUBLE_EQ(Topology("ring", 8).neighbours(3, 0)[1].weight, 1.0 / 3);
}

TEST(TopologyTest, SpectralGapsMatchTheClosedForms) {
  // Ring with MH weights 1/3: eigenvalues 1/3 + 2/3 cos(2 pi k / n).
  for (int n : {8, 32}) {
    EXPECT_NEAR(Topology("ring", n).spectral_gap(), 2.0 / 3 * (1 - std::cos(2 * M_PI / n)), 1e-10) << n;
  }
  EXPECT_NEAR(Topology("ring", 32).spectral_gap(), 0.0128, 5e-5);
  // 4 x 8 torus, weights 1/5: 1 - (1/5 + 2/5 (1 + cos(2 pi / 8))).
  EXPECT_NEAR(Topology("torus", 32).spectral_gap(), 0.117, 5e-4);
  EXPECT_NEAR(Topology("complete", 8).spectral_gap(), 1.0, 1e-12);
  // One-peer exponential: the product over log2 n steps is the exact average.
  for (int n : {2, 4, 8, 16}) EXPECT_NEAR(Topology("onepeer", n).consensus_rate(), 0.0, 1e-12) << n;
  EXPECT_GT(Topology("exp", 32).spectral_gap(), Topology("torus", 32).spectral_gap());
}

TEST(TopologyTest, BadGraphsAreErrorsThatNameTheProblem) {
  EXPECT_NE(error_of([] { Topology("star", 4); }).find("valid topologies: ring, torus, exp"), std::string::npos);
  EXPECT_NE(error_of([] { Topology("onepeer", 6); }).find("power-of-two"), std::string::npos);
  EXPECT_NE(error_of([] { Topology("torus", 7); }).find("factors"), std::string::npos);
  EXPECT_NE(error_of([] { Topology("ring", 4, "random"); }).find("weights must be"), std::string::npos);
  EXPECT_NE(error_of([] { Topology("explicit", 4, "mh", "0-1;2-3"); }).find("not connected"), std::string::npos);
  EXPECT_NE(error_of([] { Topology("explicit", 4, "mh", "0-1;1-4"); }).find("rank >= the group size"),
            std::string::npos);
  EXPECT_NE(error_of([] { Topology("explicit", 4, "mh", "0-1;1-x"); }).find("'1-x' is not rank-rank"),
            std::string::npos);
  EXPECT_NE(error_of([] { Topology("explicit", 4, "mh", "0-0"); }).find("self-loop"), std::string::npos);
  EXPECT_NE(error_of([] { Topology("explicit", 4); }).find("give its undirected edges"), std::string::npos);
  EXPECT_NE(error_of([] { Topology("ring", 4, "mh", "0-1"); }).find("only for topology=explicit"),
            std::string::npos);
}

TEST(TopologyTest, GossipSpecsAreCheckedWhenMade) {
  auto make = [](const std::string& text) { return [text] { make_aggregation(BoundSpec(text)); }; };
  EXPECT_EQ(error_of(make("gossip")), "");
  EXPECT_EQ(error_of(make("gossip:topology=explicit,edges=0-1;1-2")), "");
  EXPECT_EQ(error_of(make("choco:topology=ring,compress=topk,density=0.01,gamma=0.1")), "");
  EXPECT_NE(error_of(make("gossip:topology=star")).find("topology must be one of ring"), std::string::npos);
  EXPECT_NE(error_of(make("gossip:topology=ring,edges=0-1")).find("edges are only for"), std::string::npos);
  EXPECT_NE(error_of(make("gossip:density=0.1")).find("unknown key 'density'"), std::string::npos);
  EXPECT_NE(error_of(make("choco:compress=sign")).find("choco needs gamma"), std::string::npos);
  EXPECT_NE(error_of(make("choco:compress=sign,gamma=1.5")).find("gamma must be a number in (0, 1]"), std::string::npos);
  EXPECT_NE(error_of(make("choco:topology=onepeer,gamma=0.5")).find("onepeer"), std::string::npos);
  EXPECT_NE(error_of(make("choco:compress=zip,gamma=0.5")).find("compress must be one of"), std::string::npos);
  EXPECT_NE(error_of(make("choco:compress=sign,density=0.1,gamma=0.5")).find("unknown key 'density' for aggregation 'choco' with compress=sign"),
            std::string::npos);
  EXPECT_NE(error_of(make("choco:compress=sign,vote=majority,gamma=0.5")).find("unknown key 'vote'"),
            std::string::npos);
}

}  // namespace
}  // namespace gradzip
