// Decode-accumulate on the GPU, the contract of every codec's device decoder (each in
// cuda/<codec>.cu): adds one payload's values into a float sum, element by element as
// the CPU decoders do (docs/wire-format.md, "Values"), so that decoding P payloads in
// rank order on one stream adds every element's terms in rank order: no float atomics,
// the same sum on every rank and every run, bitwise the CPU's. sign and qsgd (like the
// casts) decode in `_rows` form only: all P payloads of one layout at once, each
// element's terms added in rank order in a register (one payload is a single row): the
// same bits, with one read and write of the sum.
//
// The host has already checked the fixed fields and every section length against the
// payload size (device_codec.cpp). What only the data can tell is checked by the kernels, on the
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

// out[i] = (set ? 0 : out[i]) + scale · terms[i].
void add_scaled(float* out, const float* terms, float scale, bool set, int64_t n, cudaStream_t stream);

}  // namespace gradzip::cuda
