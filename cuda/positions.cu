// Positions on the GPU (codec/position_coding.h): k ascending indices coded as
// Golomb-Rice gaps or as a bitmap, written and read with the bytes of the CPU's
// code_positions and read_positions. stc and compact topk (values=fp16|bf16) use both.
#include "positions.h"

#include <cub/device/device_scan.cuh>

#include <algorithm>

#include "codec/element_math.cuh"
#include "codec/wire.h"
#include "cuda_check.h"
#include "decode_accumulate.h"
#include "payload_memory.cuh"
#include "scratch_carver.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;

// The writer's scratch: each code's length and start, and the positions' words.
struct WriteScratch {
  uint64_t* code_bits;    // count
  uint64_t* code_starts;  // count
  uint32_t* positions;    // ceil(n/32) + 2 words: the bitmap, or the Golomb codes (used only when not longer)
  void* cub_temp;
  size_t cub_bytes;
  size_t total;

  WriteScratch(void* base, int64_t n, int64_t count) {
    ScratchCarver carve(base);
    code_bits = carve.take<uint64_t>(static_cast<size_t>(count));
    code_starts = carve.take<uint64_t>(static_cast<size_t>(count));
    positions = carve.take<uint32_t>(static_cast<size_t>(n) / 32 + 2);
    cub_bytes = 0;
    check(cub::DeviceScan::ExclusiveSum(nullptr, cub_bytes, code_bits, code_starts, count), "cub::DeviceScan (size)");
    cub_temp = carve.take_bytes(cub_bytes);
    total = carve.size();
  }
};

__device__ __forceinline__ uint64_t gap_before(const int64_t* indices, int64_t j) {
  return static_cast<uint64_t>(indices[j] - (j ? indices[j - 1] : -1) - 1);
}

__global__ void __launch_bounds__(kThreads)
    golomb_code_bits(const int64_t* indices, int64_t count, int b, uint64_t* bits) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < count) bits[j] = math::golomb_rice_bits(gap_before(indices, j), b);
}

// ORs the low `length` bits of value into the bit string at `position`.
__device__ __forceinline__ void or_bits(uint32_t* words, uint64_t position, uint64_t value, int length) {
  while (length > 0) {
    const int offset = static_cast<int>(position % 32);
    const int take = length < 32 - offset ? length : 32 - offset;
    const uint32_t part = static_cast<uint32_t>(value & ((uint64_t{1} << take) - 1));
    atomicOr(&words[position / 32], part << offset);
    position += take;
    value >>= take;
    length -= take;
  }
}

__global__ void __launch_bounds__(kThreads)
    write_golomb_codes(const int64_t* indices, const uint64_t* starts, int64_t count, int b, uint32_t* words) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const uint64_t gap = gap_before(indices, j);
  uint64_t position = starts[j];
  // The unary quotient: its share of the first word (which it may share with the code
  // before), whole words (this code's alone: plain stores, no atomics), the rest.
  uint64_t ones = gap >> b;
  const uint64_t lead = ones < (32 - position % 32) % 32 ? ones : (32 - position % 32) % 32;
  if (lead) or_bits(words, position, 0xffffffffu, static_cast<int>(lead));
  position += lead;
  ones -= lead;
  for (; ones >= 32; ones -= 32, position += 32) words[position / 32] = 0xffffffffu;
  if (ones) or_bits(words, position, 0xffffffffu, static_cast<int>(ones));
  position += ones + 1;  // the terminating zero
  if (b) or_bits(words, position, gap & ((uint64_t{1} << b) - 1), b);
}

__global__ void __launch_bounds__(kThreads) mark_bitmap(const int64_t* indices, int64_t count, uint32_t* words) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < count) atomicOr(&words[indices[j] / 32], 1u << (indices[j] % 32));
}

// Golomb-Rice positions in parallel. The stream is cut into segments of kSegmentBits;
// each segment is run through math::rice_next_state from every entry state (0..b),
// giving its exit state and how many codes end in it; groups of kGroupSegments compose
// those tables, one thread chains the groups (their tables staged in shared memory by
// its block), each group's thread then its segments, so
// every segment knows its true entry state and how many codes precede it. A second run
// records where each code ends; a code's gap follows from its end, the previous code's
// end and its remainder bits; an exclusive scan of gap + 1 gives the positions.
constexpr int kSegmentBits = 512;
constexpr int kGroupSegments = 64;
constexpr uint64_t kNoEnd = ~uint64_t{0};

__device__ __forceinline__ uint32_t bit_at(const uint8_t* data, uint64_t p) { return (data[p / 8] >> (p % 8)) & 1u; }

// Runs bits [begin, end) from `state`; returns the exit state, counts the codes that
// end, and with `ends` records code first + c's end for those below k.
__device__ uint32_t run_segment(const uint8_t* data, uint64_t begin, uint64_t end, uint32_t state, int b,
                                uint32_t& codes, uint64_t* ends, uint64_t first, int64_t k) {
  codes = 0;
  for (uint64_t p = begin; p < end; ++p) {
    bool completed = false;
    state = math::rice_next_state(state, bit_at(data, p), b, completed);
    if (completed) {
      if (ends && first + codes < static_cast<uint64_t>(k)) ends[first + codes] = p + 1;
      ++codes;
    }
  }
  return state;
}

__global__ void __launch_bounds__(kThreads)
    rice_segment_tables(const uint8_t* data, uint64_t bits, int64_t segments, int states, int b, uint8_t* exits,
                        uint32_t* codes) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s = t / states;
  if (s >= segments) return;
  const uint64_t begin = static_cast<uint64_t>(s) * kSegmentBits;
  const uint64_t end = begin + kSegmentBits < bits ? begin + kSegmentBits : bits;
  uint32_t count = 0;
  exits[t] = static_cast<uint8_t>(run_segment(data, begin, end, static_cast<uint32_t>(t % states), b, count, nullptr, 0, 0));
  codes[t] = count;
}

__global__ void __launch_bounds__(kThreads)
    rice_group_tables(int64_t segments, int64_t groups, int states, const uint8_t* exits, const uint32_t* codes,
                      uint8_t* group_exits, uint64_t* group_codes) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t g = t / states;
  if (g >= groups) return;
  uint32_t state = static_cast<uint32_t>(t % states);
  uint64_t count = 0;
  for (int64_t s = g * kGroupSegments; s < segments && s < (g + 1) * kGroupSegments; ++s) {
    count += codes[s * states + state];
    state = exits[s * states + state];
  }
  group_exits[t] = static_cast<uint8_t>(state);
  group_codes[t] = count;
}

// The groups' tables, a chunk at a time, are loaded into shared memory by the whole
// block (coalesced, independent loads); one thread then chains the chunk's groups there,
// a shared-memory load per step instead of a dependent global one.
constexpr int kChainEntries = 2048;  // group-table entries per chunk: 18 KiB of shared memory
static_assert(kMaxGolombParameter + 1 <= kChainEntries, "a chunk holds at least one group's table");

__global__ void __launch_bounds__(kThreads)
    rice_group_entries(int64_t groups, int states, const uint8_t* group_exits, const uint64_t* group_codes,
                       uint8_t* group_entry, uint64_t* group_before) {
  __shared__ uint64_t chunk_codes[kChainEntries];
  __shared__ uint8_t chunk_exits[kChainEntries];
  const int64_t chunk = kChainEntries / states;  // states <= kMaxGolombParameter + 1 < kChainEntries
  uint32_t state = 0;   // thread 0's
  uint64_t before = 0;  // thread 0's
  for (int64_t first = 0; first < groups; first += chunk) {
    const int64_t count = groups - first < chunk ? groups - first : chunk;
    for (int64_t i = threadIdx.x; i < count * states; i += blockDim.x) {
      chunk_codes[i] = group_codes[first * states + i];
      chunk_exits[i] = group_exits[first * states + i];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int64_t g = 0; g < count; ++g) {
        group_entry[first + g] = static_cast<uint8_t>(state);
        group_before[first + g] = before;
        before += chunk_codes[g * states + state];
        state = chunk_exits[g * states + state];
      }
    }
    __syncthreads();  // the chunk is read before the next overwrites it
  }
}

__global__ void __launch_bounds__(kThreads)
    rice_segment_entries(int64_t segments, int64_t groups, int states, const uint8_t* exits, const uint32_t* codes,
                         const uint8_t* group_entry, const uint64_t* group_before, uint8_t* entry, uint64_t* before) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  uint32_t state = group_entry[g];
  uint64_t count = group_before[g];
  for (int64_t s = g * kGroupSegments; s < segments && s < (g + 1) * kGroupSegments; ++s) {
    entry[s] = static_cast<uint8_t>(state);
    before[s] = count;
    count += codes[s * states + state];
    state = exits[s * states + state];
  }
}

__global__ void __launch_bounds__(kThreads)
    rice_code_ends(const uint8_t* data, uint64_t bits, int64_t segments, int b, const uint8_t* entry,
                   const uint64_t* before, int64_t k, uint64_t* ends) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= segments) return;
  const uint64_t begin = static_cast<uint64_t>(s) * kSegmentBits;
  const uint64_t end = begin + kSegmentBits < bits ? begin + kSegmentBits : bits;
  uint32_t count = 0;
  run_segment(data, begin, end, entry[s], b, count, ends, before[s], k);
}

// Code j's gap + 1, with the CPU decoder's checks: k codes present, quotients <= n,
// gaps inside the tensor, no bytes left over after the last code.
__global__ void __launch_bounds__(kThreads)
    rice_steps(const uint8_t* data, uint64_t bytes, int b, const uint64_t* ends, int64_t k, int64_t n, uint64_t* steps,
               int* error) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  steps[j] = 0;
  const uint64_t end = ends[j];
  const uint64_t start = j ? ends[j - 1] : 0;
  if (end == kNoEnd || start == kNoEnd) {
    atomicOr(error, kBadPositions);
    return;
  }
  const uint64_t terminator = end - 1 - static_cast<uint64_t>(b);
  const uint64_t quotient = terminator - start;
  uint64_t remainder = 0;
  for (int i = 0; i < b; ++i) remainder |= static_cast<uint64_t>(bit_at(data, terminator + 1 + i)) << i;
  const uint64_t gap = (quotient << b) | remainder;
  if (quotient > static_cast<uint64_t>(n) || gap >= static_cast<uint64_t>(n)) {
    atomicOr(error, kBadPositions);
    return;
  }
  steps[j] = gap + 1;
  if (j == k - 1 && (end + 7) / 8 != bytes) atomicOr(error, kBadPositions);
}

__global__ void __launch_bounds__(kThreads)
    rice_indices(const uint64_t* steps, const uint64_t* before, int64_t k, int64_t n, int64_t* indices, int* error) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  // Steps are at most n, so the first position past n comes before any sum could wrap around.
  const uint64_t index = before[j] + steps[j] - 1;
  if (steps[j] == 0 || index >= static_cast<uint64_t>(n)) {  // steps[j] = 0: rice_steps flagged it
    atomicOr(error, kBadPositions);
    indices[j] = -1;
    return;
  }
  indices[j] = static_cast<int64_t>(index);
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

// The decoder's scratch, carved for one payload's position coding only: the k indices,
// a bitmap's per-word counts, or the Golomb decoder's segment tables and per-code arrays.
struct ReadScratch {
  int64_t* indices = nullptr;  // k
  uint64_t* counts = nullptr;  // bitmap: marks per word
  uint64_t* before = nullptr;
  uint8_t* exits = nullptr;  // Golomb: per segment and entry state
  uint32_t* codes = nullptr;
  uint8_t* group_exits = nullptr;
  uint64_t* group_codes = nullptr;
  uint8_t* group_entry = nullptr;
  uint64_t* group_before = nullptr;
  uint8_t* entry = nullptr;
  uint64_t* segment_before = nullptr;
  uint64_t* ends = nullptr;   // k
  uint64_t* steps = nullptr;  // k
  uint64_t* sums = nullptr;   // k: steps before each code
  void* cub_temp = nullptr;
  size_t cub_bytes = 0;
  size_t total = 0;
  int64_t segments = 0, groups = 0;

  ReadScratch(void* base, int64_t n, int64_t k, uint64_t position_bytes, bool bitmap) {
    ScratchCarver carve(base);
    const size_t kk = static_cast<size_t>(k);
    indices = carve.take<int64_t>(kk);
    if (bitmap) {
      const size_t words = static_cast<size_t>((n + 31) / 32);
      counts = carve.take<uint64_t>(words);
      before = carve.take<uint64_t>(words);
      check(cub::DeviceScan::ExclusiveSum(nullptr, cub_bytes, counts, before, static_cast<int64_t>(words)),
            "cub::DeviceScan (size)");
    } else {
      const size_t states = kMaxGolombParameter + 1;
      segments = static_cast<int64_t>((position_bytes * 8 + kSegmentBits - 1) / kSegmentBits);
      groups = (segments + kGroupSegments - 1) / kGroupSegments;
      const size_t ss = static_cast<size_t>(segments), gg = static_cast<size_t>(groups);
      exits = carve.take<uint8_t>(ss * states);
      codes = carve.take<uint32_t>(ss * states);
      group_exits = carve.take<uint8_t>(gg * states);
      group_codes = carve.take<uint64_t>(gg * states);
      group_entry = carve.take<uint8_t>(gg);
      group_before = carve.take<uint64_t>(gg);
      entry = carve.take<uint8_t>(ss);
      segment_before = carve.take<uint64_t>(ss);
      ends = carve.take<uint64_t>(kk);
      steps = carve.take<uint64_t>(kk);
      sums = carve.take<uint64_t>(kk);
      check(cub::DeviceScan::ExclusiveSum(nullptr, cub_bytes, steps, sums, k), "cub::DeviceScan (size)");
    }
    cub_temp = carve.take_bytes(cub_bytes);
    total = carve.size();
  }
};

void decode_golomb(const uint8_t* data, uint64_t bytes, int b, int64_t k, int64_t n, int* error, const ReadScratch& s,
                   cudaStream_t stream) {
  const int states = b + 1;
  const uint64_t bits = bytes * 8;
  check(cudaMemsetAsync(s.ends, 0xff, 8 * static_cast<size_t>(k), stream), "clearing the code ends");
  if (s.segments > 0) {
    rice_segment_tables<<<blocks_for(s.segments * states, kThreads), kThreads, 0, stream>>>(data, bits, s.segments,
                                                                                           states, b, s.exits, s.codes);
    check_launch("rice_segment_tables");
    rice_group_tables<<<blocks_for(s.groups * states, kThreads), kThreads, 0, stream>>>(
        s.segments, s.groups, states, s.exits, s.codes, s.group_exits, s.group_codes);
    check_launch("rice_group_tables");
    rice_group_entries<<<1, kThreads, 0, stream>>>(s.groups, states, s.group_exits, s.group_codes, s.group_entry,
                                                   s.group_before);
    check_launch("rice_group_entries");
    rice_segment_entries<<<blocks_for(s.groups, kThreads), kThreads, 0, stream>>>(
        s.segments, s.groups, states, s.exits, s.codes, s.group_entry, s.group_before, s.entry, s.segment_before);
    check_launch("rice_segment_entries");
    rice_code_ends<<<blocks_for(s.segments, kThreads), kThreads, 0, stream>>>(data, bits, s.segments, b, s.entry,
                                                                              s.segment_before, k, s.ends);
    check_launch("rice_code_ends");
  }
  rice_steps<<<blocks_for(k, kThreads), kThreads, 0, stream>>>(data, bytes, b, s.ends, k, n, s.steps, error);
  check_launch("rice_steps");
  size_t temp = s.cub_bytes;
  check(cub::DeviceScan::ExclusiveSum(s.cub_temp, temp, s.steps, s.sums, k, stream), "cub::DeviceScan");
  rice_indices<<<blocks_for(k, kThreads), kThreads, 0, stream>>>(s.steps, s.sums, k, n, s.indices, error);
  check_launch("rice_indices");
}

// The k positions into the scratch's indices (bitmap or Golomb-Rice); they are valid
// where *error stays 0. False when there is nothing to add (k = 0).
bool decode_positions(const uint8_t* positions, uint64_t position_bytes, bool bitmap, int golomb_parameter, int64_t k,
                      int64_t n, int* error, const ReadScratch& s, cudaStream_t stream) {
  if (bitmap) {
    const int64_t words = (n + 31) / 32;
    if (words == 0) return false;  // n = 0, so k = 0
    bitmap_counts<<<blocks_for(words, kThreads), kThreads, 0, stream>>>(positions, n, words, s.counts);
    check_launch("bitmap_counts");
    size_t bytes = s.cub_bytes;
    check(cub::DeviceScan::ExclusiveSum(s.cub_temp, bytes, s.counts, s.before, words, stream), "cub::DeviceScan");
    check_bitmap_total<<<1, 1, 0, stream>>>(s.counts, s.before, words, k, error);
    check_launch("check_bitmap_total");
    bitmap_indices<<<blocks_for(words, kThreads), kThreads, 0, stream>>>(positions, n, words, s.before, k, error,
                                                                         s.indices);
    check_launch("bitmap_indices");
  } else if (k > 0) {  // k = 0: the host checked that no position bytes are left over
    decode_golomb(positions, position_bytes, golomb_parameter, k, n, error, s, stream);
  }
  return k > 0;
}

}  // namespace

size_t position_writing_scratch_bytes(int64_t n, int64_t count) { return WriteScratch(nullptr, n, count).total; }

PositionPlan plan_positions(int64_t n, const int64_t* indices, int64_t count, void* scratch, cudaStream_t stream) {
  PositionPlan plan;
  plan.golomb_parameter = golomb_parameter(count, n);
  if (count > 0) {
    const WriteScratch s(scratch, n, count);
    golomb_code_bits<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(indices, count, plan.golomb_parameter,
                                                                           s.code_bits);
    check_launch("golomb_code_bits");
    size_t bytes = s.cub_bytes;
    check(cub::DeviceScan::ExclusiveSum(s.cub_temp, bytes, s.code_bits, s.code_starts, count, stream),
          "cub::DeviceScan");
    uint64_t last[2];  // the last code's start and length
    check(cudaMemcpyAsync(&last[0], s.code_starts + count - 1, 8, cudaMemcpyDeviceToHost, stream), "reading the Golomb length");
    check(cudaMemcpyAsync(&last[1], s.code_bits + count - 1, 8, cudaMemcpyDeviceToHost, stream), "reading the Golomb length");
    check(cudaStreamSynchronize(stream), "planning the positions");
    plan.golomb_bits = last[0] + last[1];
  }
  const uint64_t golomb_bytes = wire::bytes_for_bits(plan.golomb_bits);
  plan.bitmap = golomb_bytes > wire::bytes_for_bits(static_cast<uint64_t>(n));
  plan.position_bytes = plan.bitmap ? wire::bytes_for_bits(static_cast<uint64_t>(n)) : golomb_bytes;
  return plan;
}

void write_positions_on_device(const PositionPlan& plan, int64_t n, const int64_t* indices, int64_t count, uint8_t* out,
                               void* scratch, cudaStream_t stream) {
  if (count <= 0) return;
  const WriteScratch s(scratch, n, count);
  const size_t words = (plan.position_bytes + 3) / 4;
  check(cudaMemsetAsync(s.positions, 0, 4 * words, stream), "clearing the positions");
  if (plan.bitmap) {
    mark_bitmap<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(indices, count, s.positions);
    check_launch("mark_bitmap");
  } else {
    write_golomb_codes<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(indices, s.code_starts, count,
                                                                             plan.golomb_parameter, s.positions);
    check_launch("write_golomb_codes");
  }
  check(cudaMemcpyAsync(out, s.positions, plan.position_bytes, cudaMemcpyDeviceToDevice, stream),
        "copying the positions");
}

size_t position_reading_scratch_bytes(int64_t n, int64_t k, const PositionLayout& positions) {
  return ReadScratch(nullptr, n, k, positions.bytes.bytes, positions.bitmap).total;
}

const int64_t* read_positions_on_device(const uint8_t* payload, const PositionLayout& positions, int64_t k, int64_t n,
                                        int* error, void* scratch, cudaStream_t stream) {
  const ReadScratch s(scratch, n, k, positions.bytes.bytes, positions.bitmap);
  if (!decode_positions(payload + positions.bytes.offset, positions.bytes.bytes, positions.bitmap,
                        positions.golomb_parameter, k, n, error, s, stream)) {
    return nullptr;
  }
  return s.indices;
}

}  // namespace gradzip::cuda
