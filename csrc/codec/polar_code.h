// Polar lossy source coding of binary sources (Korada & Urbanke, "Polar codes are
// optimal for lossy source coding", IEEE Trans. Inf. Theory 56(4), 2010).
//
// Bits are one per byte, each 0 or 1. A block has N = 2^m bits, 0 <= m <= kMaxM.
//
// transform: x = u·G_N over GF(2), G_N = F^{⊗m}, F = [[1,0],[1,1]], in natural order
// (no bit-reversal permutation B_N): x = [a ⊕ b, b] where a and b are the transforms of
// u's first and second halves. This is komm's convention: with u zero on `frozen`,
// transform(u) equals komm.PolarCode(m, frozen).encode(u[active]). G_N·G_N = I, so
// transform is its own inverse.
//
// A code at rate R = free_count / N has N − free_count frozen indices, fixed to 0; its
// free bits (u at the other indices, in index order) are what is sent. The test channel
// is BSC(D), D = rate_distortion_bound(R) = h2^{-1}(1 − R): the least distortion any
// code of rate R reaches on a Bernoulli(1/2) source.
//
// frozen_mask freezes the synthetic channels of BSC(D) with the largest Bhattacharyya
// parameters, the lower index first among equal ones. The parameters are Tal & Vardy's
// degrading-merge estimates ("How to construct polar codes", 2013) with 4 output
// classes per channel; channel i's top index bit picks its first step (0: W−, 1: W+).
//
// Encoder: successive-cancellation encoding of the source y with the LLRs of BSC(D),
// each free u_i set to its more likely value (0 on a tie). With list_size L > 1, SC list
// encoding: at each free index it keeps the L most likely of the extended paths (ties
// to the earlier path, then to bit 0) and in the end returns the path whose
// reconstruction is closest to y (ties to the more likely, then the earlier). LLRs are
// integers in 1/64 nat, boxplus with a tabulated correction term, so every machine
// makes the same decisions. Time O(L·N·log N), memory O(L·N).
//
// decode: u = the free bits at the free indices, 0 elsewhere; out = transform(u).
// Encoder::encode returns the Hamming distance between the source and that output.
//
// Everything is deterministic: integers, and doubles in a fixed order with + − × ÷ and
// √ only (built without multiply-add contraction).
#pragma once

#include <cstdint>
#include <vector>

namespace gradzip::polar {

constexpr int kMaxM = 20;

// h2^{-1}(1 − rate) in [0, 1/2]: 1/2 at rate <= 0, 0 at rate >= 1. Deterministic (no libm).
double rate_distortion_bound(double rate);

// N bytes, 1 = frozen, exactly N − free_count of them. 0 <= free_count <= N.
// O(N) time, about 60 ms at m = 16: call it once per (m, free_count).
std::vector<uint8_t> frozen_mask(int m, int free_count);

// In place on N bytes.
void transform(uint8_t* bits, int m);

class Encoder {
 public:
  explicit Encoder(int m, int list_size = 1);

  // Reads N source bits and an N-byte frozen mask (0 or 1 each); writes its free bits.
  int64_t encode(const uint8_t* source, const uint8_t* frozen, uint8_t* free_bits_out);

 private:
  void node(int level, int first, uint8_t* x_out, int* parent_out);
  void leaf(int index, uint8_t* bit, int* parent_out);

  int m_;
  int list_size_;
  int paths_ = 0;
  const uint8_t* frozen_ = nullptr;
  int leaf_llr_ = 0;     // |LLR| of one source bit, for the rate of `cached_free_`
  int cached_free_ = -1;
  // Per level l (nodes of 2^l bits), one row per path: alpha_[l], the LLRs into the
  // running node (one row at the root); bits_[l], the x of the left and then of the right
  // node (the root's x alone at l = m); from_left_[l] and from_right_[l], for each path
  // after the left and the right child of the running node, the row it continued.
  std::vector<std::vector<int32_t>> alpha_;
  std::vector<std::vector<uint8_t>> bits_;
  std::vector<std::vector<int>> from_left_, from_right_;
  std::vector<int64_t> metric_, next_metric_;  // per path: Σ |LLR| of the bits against it
  struct Candidate {
    int64_t metric;
    int path;
    uint8_t bit;
  };
  std::vector<Candidate> candidates_;
  std::vector<uint8_t> u_;
};

// One-shot forms of Encoder(m, list_size).encode and of its inverse.
int64_t encode(const uint8_t* source, int m, const uint8_t* frozen, uint8_t* free_bits_out, int list_size = 1);
void decode(const uint8_t* free_bits, int m, const uint8_t* frozen, uint8_t* out);

}  // namespace gradzip::polar
