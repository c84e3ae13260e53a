// Decode-accumulate kernels (see decode_accumulate.h): one thread per element or per
// entry, each element written by at most one thread per payload.
#include <cub/device/device_scan.cuh>

#include "cuda_check.h"
#include "decode_accumulate.h"
#include "element_math.cuh"
#include "payload_bytes.cuh"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

__global__ void __launch_bounds__(kThreads)
    topk_add(const uint8_t* index_bytes, const uint8_t* value_bytes, int64_t k, int width, float* out, int64_t n,
             int* error) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const uint64_t index = load_le(index_bytes + j * width, width);
  const bool ascending = j == 0 || load_le(index_bytes + (j - 1) * width, width) < index;
  if (index >= static_cast<uint64_t>(n) || !ascending) {
    atomicOr(error, kBadIndex);
    return;
  }
  out[index] += math::bits_float(static_cast<uint32_t>(load_le(value_bytes + 4 * j, 4)));
}

// The bits [position, position + 64) of a stream of `bytes` bytes, zeros past its end.
__device__ uint64_t peek64(const uint8_t* data, uint64_t bytes, uint64_t position) {
  const uint64_t first = position / 8;
  const int shift = static_cast<int>(position % 8);
  uint64_t window = 0;
  for (int b = 0; b < 8; ++b) {
    if (first + b < bytes) window |= static_cast<uint64_t>(data[first + b]) << (8 * b);
  }
  if (shift && first + 8 < bytes) window = (window >> shift) | (static_cast<uint64_t>(data[first + 8]) << (64 - shift));
  else if (shift) window >>= shift;
  return window;
}

// One thread: the Golomb-Rice stream to k ascending indices, with the CPU decoder's
// checks (each failure of the CPU decoder is a failure here).
__global__ void golomb_decode(const uint8_t* data, uint64_t bytes, int b, int64_t k, int64_t n, int64_t* indices,
                              int* error) {
  const uint64_t total = bytes * 8;
  uint64_t position = 0;
  int64_t at = -1;
  for (int64_t j = 0; j < k; ++j) {
    uint64_t quotient = 0;
    for (;;) {  // count the one-bits, up to 64 at a time
      if (position >= total) {
        atomicOr(error, kBadPositions);
        return;
      }
      const uint64_t window = peek64(data, bytes, position);
      const uint64_t left = total - position;
      uint64_t ones = ~window == 0 ? 64 : static_cast<uint64_t>(__ffsll(static_cast<long long>(~window)) - 1);
      if (ones > left) ones = left;
      quotient += ones;
      position += ones;
      if (quotient > static_cast<uint64_t>(n)) {
        atomicOr(error, kBadPositions);
        return;
      }
      if (ones < 64) break;
    }
    if (position >= total) {  // no terminating zero
      atomicOr(error, kBadPositions);
      return;
    }
    position += 1;
    if (position + b > total) {
      atomicOr(error, kBadPositions);
      return;
    }
    const uint64_t remainder = b ? peek64(data, bytes, position) & ((uint64_t{1} << b) - 1) : 0;
    position += b;
    const uint64_t gap = (quotient << b) | remainder;
    if (gap >= static_cast<uint64_t>(n - at - 1)) {
      atomicOr(error, kBadPositions);
      return;
    }
    at += static_cast<int64_t>(gap) + 1;
    indices[j] = at;
  }
  if ((position + 7) / 8 != bytes) atomicOr(error, kBadPositions);
}

// Marks of the bitmap in word w (bits of elements 32w .. 32w + 31 below n).
__device__ uint32_t bitmap_word(const uint8_t* bitmap, int64_t n, int64_t w) {
  uint32_t word = 0;
  for (int b = 0; b < 4; ++b) {
    const int64_t byte = 4 * w + b;
    if (byte * 8 < n) word |= static_cast<uint32_t>(bitmap[byte]) << (8 * b);
  }
  const int64_t valid = n - 32 * w;
  return valid >= 32 ? word : word & ((1u << valid) - 1u);
}

__global__ void __launch_bounds__(kThreads)
    bitmap_counts(const uint8_t* bitmap, int64_t n, int64_t words, uint64_t* counts) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w < words) counts[w] = __popc(bitmap_word(bitmap, n, w));
}

__global__ void check_bitmap_total(const uint64_t* counts, const uint64_t* before, int64_t words, int64_t k,
                                   int* error) {
  if (before[words - 1] + counts[words - 1] != static_cast<uint64_t>(k)) atomicOr(error, kBadPositions);
}

__global__ void __launch_bounds__(kThreads)
    bitmap_indices(const uint8_t* bitmap, int64_t n, int64_t words, const uint64_t* before, int64_t k,
                   const int* error, int64_t* indices) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= words || *error) return;
  uint32_t word = bitmap_word(bitmap, n, w);
  uint64_t j = before[w];
  while (word && j < static_cast<uint64_t>(k)) {
    const int bit = __ffs(static_cast<int>(word)) - 1;
    indices[j++] = 32 * w + bit;
    word &= word - 1;
  }
}

__global__ void __launch_bounds__(kThreads)
    stc_add(const int64_t* indices, const uint8_t* signs, int64_t k, float mu, float* out, int64_t n,
            const int* error) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k || *error) return;
  const int64_t i = indices[j];
  if (i < 0 || i >= n) return;  // unreachable for a payload that passed; kept as the bound of every write
  out[i] += ((signs[j / 8] >> (j % 8)) & 1) ? mu : -mu;
}

__global__ void __launch_bounds__(kThreads)
    sign_add(const float* scales, const uint32_t* bits, uint32_t block, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float scale = block ? scales[i / block] : 1.0f;
  out[i] += ((bits[i / 32] >> (i % 32)) & 1u) ? scale : -scale;
}

__global__ void __launch_bounds__(kThreads)
    qsgd_add(const float* norms, const uint32_t* codes, int width, uint32_t levels, uint32_t bucket, float* out,
             int64_t n, int* error) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint64_t position = static_cast<uint64_t>(i) * static_cast<uint64_t>(width);
  const int offset = static_cast<int>(position % 32);
  uint32_t code = codes[position / 32] >> offset;
  if (offset + width > 32) code |= codes[position / 32 + 1] << (32 - offset);
  code &= (1u << width) - 1u;
  const uint32_t sign_bit = 1u << (width - 1);
  const uint32_t level = code & (sign_bit - 1u);
  if (level > levels) {
    atomicOr(error, kBadLevel);
    return;
  }
  const float unit = norms[i / bucket] / static_cast<float>(levels);
  const float magnitude = unit * static_cast<float>(level);
  out[i] += (code & sign_bit) ? -magnitude : magnitude;
}

struct StcScratch {
  int64_t* indices;
  uint64_t* counts;
  uint64_t* before;
  void* cub_temp;
  size_t cub_bytes;
  size_t total;

  StcScratch(void* base, int64_t n, int64_t k) {
    auto* at = static_cast<char*>(base);
    size_t offset = 0;
    auto take = [&](size_t bytes) {
      char* p = at ? at + offset : nullptr;
      offset += align256(bytes);
      return p;
    };
    const int64_t words = (n + 31) / 32;
    indices = reinterpret_cast<int64_t*>(take(8 * static_cast<size_t>(k)));
    counts = reinterpret_cast<uint64_t*>(take(8 * static_cast<size_t>(words)));
    before = reinterpret_cast<uint64_t*>(take(8 * static_cast<size_t>(words)));
    cub_bytes = 0;
    check(cub::DeviceScan::ExclusiveSum(nullptr, cub_bytes, counts, before, words), "cub::DeviceScan (size)");
    cub_temp = take(cub_bytes);
    total = offset;
  }
};

}  // namespace

void add_topk(const uint8_t* index_bytes, const uint8_t* value_bytes, int64_t k, int width, float* out, int64_t n,
              int* error, cudaStream_t stream) {
  if (k <= 0) return;
  topk_add<<<blocks_for(k, kThreads), kThreads, 0, stream>>>(index_bytes, value_bytes, k, width, out, n, error);
  check_launch("topk_add");
}

size_t stc_decode_scratch_bytes(int64_t n, int64_t k) { return StcScratch(nullptr, n, k).total; }

void add_stc(const uint8_t* positions, uint64_t position_bytes, bool bitmap, int golomb_parameter, const uint8_t* signs,
             int64_t k, float mu, float* out, int64_t n, int* error, void* scratch, cudaStream_t stream) {
  const StcScratch s(scratch, n, k);
  if (bitmap) {
    const int64_t words = (n + 31) / 32;
    if (words == 0) return;  // n = 0: the host checked k = 0
    bitmap_counts<<<blocks_for(words, kThreads), kThreads, 0, stream>>>(positions, n, words, s.counts);
    check_launch("bitmap_counts");
    size_t bytes = s.cub_bytes;
    check(cub::DeviceScan::ExclusiveSum(s.cub_temp, bytes, s.counts, s.before, words, stream), "cub::DeviceScan");
    check_bitmap_total<<<1, 1, 0, stream>>>(s.counts, s.before, words, k, error);
    check_launch("check_bitmap_total");
    bitmap_indices<<<blocks_for(words, kThreads), kThreads, 0, stream>>>(positions, n, words, s.before, k, error,
                                                                         s.indices);
    check_launch("bitmap_indices");
  } else {
    golomb_decode<<<1, 1, 0, stream>>>(positions, position_bytes, golomb_parameter, k, n, s.indices, error);
    check_launch("golomb_decode");
  }
  if (k <= 0) return;
  stc_add<<<blocks_for(k, kThreads), kThreads, 0, stream>>>(s.indices, signs, k, mu, out, n, error);
  check_launch("stc_add");
}

void add_sign(const float* scales, const uint32_t* bits, uint32_t block, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  sign_add<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(scales, bits, block, out, n);
  check_launch("sign_add");
}

void add_qsgd(const float* norms, const uint32_t* codes, int width, uint32_t levels, uint32_t bucket, float* out,
              int64_t n, int* error, cudaStream_t stream) {
  if (n <= 0) return;
  qsgd_add<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(norms, codes, width, levels, bucket, out, n, error);
  check_launch("qsgd_add");
}

}  // namespace gradzip::cuda
