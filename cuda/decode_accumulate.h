// Decode-accumulate on the GPU: adds one payload's values into a float sum, element by
// element as the CPU decoders do (docs/wire-format.md, "Values"), so that calling these
// for P payloads in rank order on one stream adds every element's terms in rank order:
// no float atomics, the same sum on every rank and every run, bitwise the CPU's.
//
// The host has already checked the fixed fields and every section length against the
// payload size (device_codec.cpp). What only the data can tell is checked here, on the
// device: indices in range and strictly ascending (topk), Golomb streams that end within
// their bytes and stay inside the tensor, bitmaps with exactly k marks (stc), levels <= s
// (qsgd). A failure sets a bit in *error; no kernel ever writes outside out[0..n), but a
// payload that fails may have added part of its values: the caller discards the sum.
// Section pointers of sign and qsgd must be 4-byte aligned (the payload's start is).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gradzip::cuda {

// *error bits.
constexpr int kBadIndex = 1, kBadPositions = 2, kBadLevel = 4;

void add_topk(const uint8_t* index_bytes, const uint8_t* value_bytes, int64_t k, int width, float* out, int64_t n,
              int* error, cudaStream_t stream);

// Scratch for the STC decoders: k indices, the bitmap's per-word ranks, the Golomb
// decoder's segment tables (sized for any parameter b <= 40).
size_t stc_decode_scratch_bytes(int64_t n, int64_t k, uint64_t position_bytes);
void add_stc(const uint8_t* positions, uint64_t position_bytes, bool bitmap, int golomb_parameter, const uint8_t* signs,
             int64_t k, float mu, float* out, int64_t n, int* error, void* scratch, cudaStream_t stream);

void add_sign(const float* scales, const uint32_t* bits, uint32_t block, float* out, int64_t n, cudaStream_t stream);

void add_qsgd(const float* norms, const uint32_t* codes, int width, uint32_t levels, uint32_t bucket, float* out,
              int64_t n, int* error, cudaStream_t stream);

}  // namespace gradzip::cuda
