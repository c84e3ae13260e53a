// Position coding: k ascending element indices among n, as Golomb-Rice coded gaps
// (Sattler et al., 2019) or as a bitmap, whichever is smaller. stc and compact topk
// (values=fp16|bf16) send their positions this way.
//
// In a payload: u8 coding (0 Golomb-Rice gaps, 1 bitmap), u8 Golomb parameter b, u64
// position bytes, then the positions. Golomb-Rice codes each gap g (the elements skipped
// between two positions) as g >> b one-bits, a zero-bit, then the low b bits of g, with
// b = 1 + ⌊log2(ln(φ − 1) / ln(1 − k/n))⌋; the bitmap sets bit i of ceil(n/8) bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "codec/wire.h"

namespace gradzip {

constexpr uint8_t kGolombPositions = 0, kBitmapPositions = 1;
constexpr int kMaxGolombParameter = 40;
constexpr size_t kPositionHeaderBytes = 10;  // coding, b, position bytes

// The Golomb-Rice parameter for k positions among n (0 when k = 0 or k = n).
int golomb_parameter(int64_t k, int64_t n);
// The most position bytes (header excluded) that at most max_k positions among n take.
uint64_t max_position_bytes(int64_t n, int64_t max_k);

// How k positions travel: the coding, b, and the bytes that follow the position header
// (chosen by code_positions on the host, by the CUDA planner on the device).
struct PositionCoding {
  bool bitmap = false;
  int golomb_parameter = 0;
  uint64_t bytes = 0;
};
// The positions of `chosen` (ascending, below n): Golomb-Rice, or the bitmap when smaller.
struct CodedPositions {
  PositionCoding coding;
  std::vector<uint8_t> bytes;
};
CodedPositions code_positions(const std::vector<int64_t>& chosen, int64_t n);
// Appends the position header of `coding` (its bytes follow it).
void write_position_header(wire::Writer& w, const PositionCoding& coding);

struct PositionLayout {
  bool bitmap;
  int golomb_parameter;
  wire::Section bytes;
  PositionCoding coding() const { return {bitmap, golomb_parameter, bytes.bytes}; }
};
// Where positions coded so lie when their header starts at offset `at`.
PositionLayout position_layout(uint64_t at, const PositionCoding& coding);
// Reads and checks the position header of k positions among n and takes their section.
// Throws PayloadError.
PositionLayout read_position_layout(wire::Reader& r, int64_t n, uint64_t k);
// Decodes the k positions of a checked layout (ascending, below n, k of them, every byte
// used) into found[0, k); `r` names the payload in errors. Throws PayloadError (found's
// contents are then unspecified).
void read_positions(const wire::Reader& r, const PositionLayout& layout, uint64_t k, int64_t n, int64_t* found);

}  // namespace gradzip
