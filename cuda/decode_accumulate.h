// Decode-accumulate on the GPU: adds one payload's values into a float sum, element by
// element as the CPU decoders do (docs/wire-format.md, "Values"), so that calling these
// for P payloads in rank order on one stream adds every element's terms in rank order:
// no float atomics, the same sum on every rank and every run, bitwise the CPU's. sign and
// qsgd (like the casts, cast_encode.cu) decode in `_rows` form only: all P payloads of one
// layout at once, each element's terms added in rank order in a register (one payload is
// a single row): the same bits, with one read and write of the sum.
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

// Scratch for the position decoder of one payload (stc, compact topk): k indices, and
// the bitmap's per-word ranks or the Golomb decoder's segment tables (sized for any
// parameter b <= 40) and per-code arrays.
size_t positions_scratch_bytes(int64_t n, int64_t k, uint64_t position_bytes, bool bitmap);
void add_stc(const uint8_t* positions, uint64_t position_bytes, bool bitmap, int golomb_parameter, const uint8_t* signs,
             int64_t k, float mu, float* out, int64_t n, int* error, void* scratch, cudaStream_t stream);
// Compact top-k (values=fp16|bf16): the same positions, then k 2-byte values.
void add_compact_topk(const uint8_t* positions, uint64_t position_bytes, bool bitmap, int golomb_parameter,
                      const uint8_t* values, bool fp16, int64_t k, float* out, int64_t n, int* error, void* scratch,
                      cudaStream_t stream);

// out[i] = (set ? 0 : out[i]) + scale · terms[i].
void add_scaled(float* out, const float* terms, float scale, bool set, int64_t n, cudaStream_t stream);

// `count` payloads of one layout at payloads + r·stride (sections at the same offsets in
// each, 4-byte aligned), in one pass over out: out[i] = (set ? 0 : out[i]) + the terms of
// rows 0, 1, ... in order, each scaled and rounded as the host decoder's
// decode_add(..., scale) adds it. QSGD's level checks set errors[r].

struct SignRows {
  uint64_t scales_at, bits_at;
  uint32_t block;
};
void add_sign_rows(const uint8_t* payloads, size_t stride, int count, const SignRows& layout, float scale, bool set,
                   float* out, int64_t n, cudaStream_t stream);

struct QsgdRows {
  uint64_t norms_at, codes_at;
  int width;
  uint32_t levels, bucket;
};
void add_qsgd_rows(const uint8_t* payloads, size_t stride, int count, const QsgdRows& layout, float scale, bool set,
                   float* out, int64_t n, int* errors, cudaStream_t stream);

}  // namespace gradzip::cuda
