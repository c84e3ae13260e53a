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
// used); `r` names the payload in errors. Throws PayloadError. They lie in a buffer of the
// calling thread, valid until its next read_positions and kept from call to call, so that
// a decode neither allocates nor faults in fresh pages (one of more than kKeptPositions
// is freed at the thread's next call).
const int64_t* read_positions(const wire::Reader& r, const PositionLayout& layout, uint64_t k, int64_t n);
constexpr uint64_t kKeptPositions = uint64_t{1} << 22;  // 32 MiB per thread
// Positions per chunk where a codec moves values to or from scattered positions in a loop
// of its own (STC's gather of the chosen values; the decoders' scattered adds).
constexpr uint64_t kScatterChunk = 1024;

// out[indices[j]] += values[j] for j in [0, count), the targets of the positions
// kScatterAhead further on prefetched (`available` ≥ count positions may be read at
// `indices`), so that many of their cache misses are in flight at once: one per
// position at 1%, where a plain loop waits on a few at a time (25M elements, 1%, on the
// AMD EPYC of docs/results.md, STC's decode: 19.4 ns per position without, 17.9 with).
constexpr uint64_t kScatterAhead = 32;
inline void scatter_add(float* out, const int64_t* indices, const float* values, uint64_t count,
                        uint64_t available) {
  const uint64_t ahead = available > kScatterAhead ? std::min(count, available - kScatterAhead) : 0;
  uint64_t j = 0;
  for (; j < ahead; ++j) {
    __builtin_prefetch(out + indices[j + kScatterAhead], 1, 0);
    out[indices[j]] += values[j];
  }
  for (; j < count; ++j) out[indices[j]] += values[j];
}

}  // namespace gradzip
