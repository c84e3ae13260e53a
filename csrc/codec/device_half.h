// A codec's CUDA half: what a codec record's kernels are given and give back (device
// memory, payloads and rows of payloads in it, the functions each .cu defines). Without
// torch and without the CUDA headers, so that the host codecs' records can point to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gradzip/codec.h"

struct CUstream_st;  // cudaStream_t, without the CUDA headers

namespace gradzip {

// Device memory for the device halves: 256-byte aligned (payload(): 8), valid until the arena goes
// (torch's caching allocator in gradzip._C, cudaMalloc in the tests).
class DeviceArena {
 public:
  virtual ~DeviceArena() = default;
  virtual void* allocate(size_t bytes) = 0;
  // Where an encode writes its payload (`bytes`: its size rounded up to 8), 8-byte
  // aligned: a new allocation, unless the arena's owner wants it somewhere (the
  // exchange: straight into the slot that goes on the wire).
  virtual void* payload(size_t bytes) { return allocate(bytes); }
  // Scratch of at least `bytes` that the next reusable() call may hand out again: for
  // work queued one after the other on one stream, each use ending before the next
  // begins (a payload's decode scratch, payload after payload).
  void* reusable(size_t bytes) {
    if (bytes > reusable_bytes_) {
      reusable_bytes_ = bytes + bytes / 4;  // room for the next rows' slightly larger needs
      reusable_ = allocate(reusable_bytes_);
    }
    return reusable_;
  }

 private:
  void* reusable_ = nullptr;
  size_t reusable_bytes_ = 0;
};

// A payload in device memory; its allocation holds size rounded up to 8 bytes.
struct DevicePayload {
  uint8_t* data = nullptr;
  size_t size = 0;
};

// P payloads in device memory, row r at data + r·stride (`sizes[r]` bytes), with the
// first `have` bytes of each (at most its size) copied to the host at prefixes + r·prefix_stride.
struct PayloadRows {
  const uint8_t* data = nullptr;
  size_t stride = 0;
  const uint8_t* prefixes = nullptr;
  size_t prefix_stride = 0;
  size_t have = 0;
  const std::vector<size_t>* sizes = nullptr;
};

// A codec's CUDA half, defined in its .cu file: the same bytes as the host codec.
struct DeviceHalf {
  // The host codec's encode() on device memory, queued on `stream`.
  DevicePayload (*encode)(const Codec& codec, const float* x, int64_t n, float* residual,
                          const EncodeContext& ctx, DeviceArena& arena, CUstream_st* stream);
  // Checks one payload's layout with the codec's own layout parser (its first `have`
  // bytes copied to the host at `prefix`, `size` bytes in all at `payload` on the device)
  // and queues its decode-add into out[0..n). Data-dependent checks set bits in *error.
  void (*queue_decode_add)(const uint8_t* payload, const uint8_t* prefix, size_t have, size_t size, float* out,
                           int64_t n, int* error, DeviceArena& arena, CUstream_st* stream);
  // Whether the kernels handle these parameters (null: all); others run on the host.
  bool (*accepts)(const Codec& codec);
  // Codecs whose payloads hold one term per element (null: none): out[i] = (set ? 0 :
  // out[i]) + scale·term_0(i) + scale·term_1(i) + ..., in row order, each term rounded
  // as the host decode_add(..., scale) adds it, in one kernel that reads and writes out
  // once. Parses every row's layout first (PayloadError: cuda::RankPayloadError naming
  // the row); returns false, having queued nothing, when the rows are laid out
  // differently (the caller then decodes them one by one).
  bool (*queue_decode_rows)(const PayloadRows& rows, float scale, bool set, float* out, int64_t n, int* errors,
                            CUstream_st* stream) = nullptr;
};

}  // namespace gradzip
