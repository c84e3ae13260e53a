// Radix select of the k largest magnitudes (see topk_select.h). Kernels first, then the
// host dispatch. Every count is an integer atomic or a CUB scan: deterministic.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>

#include "cuda_check.h"
#include "codec/element_math.cuh"
#include "payload_memory.cuh"
#include "scratch_carver.h"
#include "topk_select.h"

namespace gradzip::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTieChunk = 4096;  // elements per block when counting ties at the threshold
constexpr int kUnroll = 4;       // independent loads in flight per thread

// The search, on the device between kernels. Chosen: key > prefix, or key == prefix at
// an index <= tie_cutoff.
struct RadixState {
  uint32_t prefix;     // the key bits decided so far (all of them once the search ends)
  uint32_t mask;       // which bits those are
  int64_t need;        // entries still to take among the keys that match prefix
  int32_t done;        // every key >= prefix is taken: the later passes do nothing
  int32_t cut_ties;    // more keys equal the threshold than are needed: find tie_cutoff
  int64_t tie_cutoff;  // the index of the last tie taken (INT64_MAX: all)
  int32_t use_candidates;           // pass 1 collects the indices that match, pass 2 reads only those
  unsigned long long candidates;    // how many it collected
  unsigned long long approx_count;
};

constexpr int kTile = kThreads * kUnroll;               // elements a block reads per step
constexpr int kCollectCapacity = 2 * kTile;             // a block's collected indices before a flush

// Appends a block's collected indices to the global list: one global atomic per block
// and flush (the list's order does not matter, it is only counted), then the block's
// threads copy them out. Called by every thread of the block.
__device__ void flush_collected(int64_t* collect, const int64_t* buffer, unsigned& fill,
                                unsigned long long* total) {
  __shared__ unsigned long long first;
  __syncthreads();
  const unsigned count = fill;
  if (threadIdx.x == 0 && count > 0) first = atomicAdd(total, static_cast<unsigned long long>(count));
  __syncthreads();
  for (unsigned c = threadIdx.x; c < count; c += blockDim.x) collect[first + c] = buffer[c];
  __syncthreads();
  if (threadIdx.x == 0) fill = 0;
  __syncthreads();
}

// One digit's histogram over the keys that match the decided prefix; with kMakeU (first
// pass with error feedback) also u = residual + x, written back, first. With `collect`
// (pass 1), when the boundary bucket of pass 0 is small enough, also the indices that
// match, so that pass 2 reads those instead of all of u (then this kernel, called for
// pass 2 with skip_when_collected, does nothing). A block gathers its indices in shared
// memory and appends them to the list with one global atomic per kTile-sized flush,
// not one per index: at 1% of 100M the boundary bucket holds about 0.6M of them, and
// atomics on one address serialize.
template <bool kMakeU>
__global__ void __launch_bounds__(kThreads)
    radix_histogram(const float* x, float* residual, int64_t n, int pass, RadixState* state,
                    unsigned long long* hist, int64_t* collect, bool skip_when_collected) {
  __shared__ unsigned counts[math::kRadixMaxBuckets];
  __shared__ int64_t collected[kCollectCapacity];
  __shared__ unsigned fill;
  const uint32_t prefix = state->prefix, mask = state->mask;
  if (state->done || (skip_when_collected && state->use_candidates)) return;  // uniform over the grid
  const bool collecting = collect != nullptr && state->use_candidates;      // uniform too
  const int buckets = static_cast<int>(math::radix_buckets(pass));
  for (int b = threadIdx.x; b < buckets; b += blockDim.x) counts[b] = 0;
  if (threadIdx.x == 0) fill = 0;
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Every thread of a block runs the same steps (the bound is the block's), so a
  // collecting block can synchronize between them.
  for (int64_t step = static_cast<int64_t>(blockIdx.x) * blockDim.x; step < n; step += kUnroll * stride) {
    const int64_t base = step + threadIdx.x;
    float u[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t i = base + j * stride;
      if (i < n) {
        if constexpr (kMakeU) {
          u[j] = residual[i] + x[i];
          residual[i] = u[j];
        } else {
          u[j] = x[i];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t i = base + j * stride;
      if (i < n) {
        const uint32_t key = math::magnitude_key(u[j]);
        if ((key & mask) == prefix) {
          atomicAdd(&counts[math::radix_digit(key, pass)], 1u);
          if (collecting) collected[atomicAdd(&fill, 1u)] = i;  // at most kTile per step
        }
      }
    }
    if (collecting) {
      __syncthreads();
      const bool full = fill > kCollectCapacity - kTile;  // read by all before any appends again
      __syncthreads();
      if (full) flush_collected(collect, collected, fill, &state->candidates);
    }
  }
  if (collecting) flush_collected(collect, collected, fill, &state->candidates);
  __syncthreads();
  for (int b = threadIdx.x; b < buckets; b += blockDim.x) {
    if (counts[b]) atomicAdd(&hist[b], static_cast<unsigned long long>(counts[b]));
  }
}

// Pass 2 over the indices pass 1 collected.
__global__ void __launch_bounds__(kThreads)
    candidate_histogram(const float* u, const int64_t* candidates, int pass, const RadixState* state,
                        unsigned long long* hist) {
  __shared__ unsigned counts[math::kRadixMaxBuckets];
  if (state->done || !state->use_candidates) return;
  const uint32_t prefix = state->prefix, mask = state->mask;
  const unsigned long long count = state->candidates;
  const int buckets = static_cast<int>(math::radix_buckets(pass));
  for (int b = threadIdx.x; b < buckets; b += blockDim.x) counts[b] = 0;
  __syncthreads();
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long c = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x; c < count;
       c += stride) {
    const uint32_t key = math::magnitude_key(u[candidates[c]]);
    if ((key & mask) == prefix) atomicAdd(&counts[math::radix_digit(key, pass)], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < buckets; b += blockDim.x) {
    if (counts[b]) atomicAdd(&hist[b], static_cast<unsigned long long>(counts[b]));
  }
}

// One block: the bucket of this pass's histogram that holds the need-th largest key,
// counting from the top. `exact` allows the early exit and asks for the tie cut.
__global__ void __launch_bounds__(kThreads)
    radix_boundary(const unsigned long long* hist, int pass, bool exact, long long candidate_capacity,
                   RadixState* state) {
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  constexpr int kPerThread = math::kRadixMaxBuckets / kThreads;
  if (state->done) return;
  const int64_t need = state->need;
  const int buckets = static_cast<int>(math::radix_buckets(pass));
  unsigned long long items[kPerThread], inclusive[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int from_top = threadIdx.x * kPerThread + j;
    items[j] = from_top < buckets ? hist[buckets - 1 - from_top] : 0;
  }
  Scan(temp).InclusiveSum(items, inclusive);  // its barrier orders every read of state before the write
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int from_top = threadIdx.x * kPerThread + j;
    const unsigned long long above = inclusive[j] - items[j];
    if (from_top < buckets && static_cast<long long>(above) < need && need <= static_cast<long long>(inclusive[j])) {
      const uint32_t bucket = static_cast<uint32_t>(buckets - 1 - from_top);
      const int64_t remaining = need - static_cast<int64_t>(above);
      const bool whole_bucket = static_cast<int64_t>(items[j]) == remaining;
      const bool last = pass == math::kRadixPasses - 1;
      state->prefix |= bucket << math::radix_shift(pass);
      state->mask = math::radix_decided_mask(pass + 1);
      state->need = remaining;
      state->done = (exact && whole_bucket) || last;
      state->cut_ties = exact && last && !whole_bucket;
      state->tie_cutoff = INT64_MAX;
      if (pass == 0) state->use_candidates = exact && static_cast<long long>(items[j]) <= candidate_capacity;
    }
  }
}

// Ties at the threshold per chunk of kTieChunk elements (only when some must be cut).
__global__ void __launch_bounds__(kThreads)
    count_ties(const float* u, int64_t n, const RadixState* state, unsigned* chunk_ties) {
  using Reduce = cub::BlockReduce<unsigned, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  if (!state->cut_ties) return;
  const uint32_t threshold = state->prefix;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kTieChunk;
  const int64_t end = begin + kTieChunk < n ? begin + kTieChunk : n;
  unsigned ties = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) ties += math::magnitude_key(u[i]) == threshold;
  const unsigned total = Reduce(temp).Sum(ties);
  if (threadIdx.x == 0) chunk_ties[blockIdx.x] = total;
}

// One block: the index of the need-th tie in index order, so that the lowest-indexed
// ties are taken, as on the CPU.
__global__ void __launch_bounds__(kThreads)
    find_tie_cutoff(const float* u, int64_t n, const unsigned* chunk_ties, int64_t chunks, RadixState* state) {
  using Scan = cub::BlockScan<long long, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ long long chunk_found, ties_before;
  if (!state->cut_ties) return;
  const long long need = state->need;
  const uint32_t threshold = state->prefix;
  long long running = 0;
  for (int64_t tile = 0; tile < chunks; tile += kThreads) {
    const long long c = tile + threadIdx.x < chunks ? chunk_ties[tile + threadIdx.x] : 0;
    long long before, total;
    Scan(temp).ExclusiveSum(c, before, total);
    if (c > 0 && running + before < need && need <= running + before + c) {
      chunk_found = tile + threadIdx.x;
      ties_before = running + before;
    }
    running += total;
    __syncthreads();  // chunk_found visible; temp free for the next scan
    if (running >= need) break;  // the same for every thread
  }
  const long long wanted = need - ties_before;  // 1-based rank of the last tie taken in the chunk
  const int64_t begin = chunk_found * kTieChunk;
  const int64_t end = begin + kTieChunk < n ? begin + kTieChunk : n;
  running = 0;
  for (int64_t tile = begin; tile < end; tile += kThreads) {
    const int64_t i = tile + threadIdx.x;
    const long long tie = i < end && math::magnitude_key(u[i]) == threshold;
    long long before, total;
    Scan(temp).ExclusiveSum(tie, before, total);
    if (tie && running + before + 1 == wanted) state->tie_cutoff = i;
    running += total;
    __syncthreads();
    if (running >= wanted) break;
  }
}

// Approximate mode: how many of u are at or above the sample's threshold.
__global__ void __launch_bounds__(kThreads) count_at_or_above(const float* u, int64_t n, RadixState* state) {
  using Reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint32_t threshold = state->prefix;
  unsigned long long count = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    count += math::magnitude_key(u[i]) >= threshold;
  }
  const unsigned long long total = Reduce(temp).Sum(count);
  if (threadIdx.x == 0 && total) atomicAdd(&state->approx_count, total);
}

__global__ void set_state(RadixState* state, RadixState value) { *state = value; }

struct ChosenByThreshold {
  const float* u;
  const RadixState* state;
  __device__ bool operator()(int64_t i) const {
    const uint32_t key = math::magnitude_key(u[i]), threshold = state->prefix;
    return key > threshold || (key == threshold && i <= state->tie_cutoff);
  }
};

// Where each piece of the scratch lives.
struct Scratch {
  RadixState* state;
  unsigned long long* hist;  // kRadixPasses × kRadixMaxBuckets
  unsigned* chunk_ties;
  int64_t* candidates;
  int64_t candidate_capacity;
  int64_t* selected;
  void* cub_temp;
  size_t cub_bytes;
  size_t total;

  Scratch(void* base, int64_t n) {
    ScratchCarver carve(base);
    state = carve.take<RadixState>(1);
    hist = carve.take<unsigned long long>(static_cast<size_t>(math::kRadixPasses) * math::kRadixMaxBuckets);
    chunk_ties = carve.take<unsigned>(static_cast<size_t>(tie_chunks(n) + 1));
    candidate_capacity = std::min<int64_t>(n, std::max<int64_t>(4096, n / 32));
    candidates = carve.take<int64_t>(static_cast<size_t>(candidate_capacity));
    selected = carve.take<int64_t>(1);
    cub_bytes = 0;
    check(cub::DeviceSelect::If(nullptr, cub_bytes, thrust::counting_iterator<int64_t>(0), static_cast<int64_t*>(nullptr),
                                static_cast<int64_t*>(nullptr), n, ChosenByThreshold{}),
          "cub::DeviceSelect::If (size)");
    cub_temp = carve.take_bytes(cub_bytes);
    total = carve.size();
  }
  static int64_t tie_chunks(int64_t n) { return (n + kTieChunk - 1) / kTieChunk; }
};

}  // namespace

size_t topk_scratch_bytes(int64_t n) { return Scratch(nullptr, n).total; }

int64_t topk_prepare(const float* x, float* residual, int64_t n, int64_t k, bool approx, void* scratch,
                     cudaStream_t stream) {
  if (n <= 0) return 0;
  const Scratch s(scratch, n);
  RadixState init{};
  init.tie_cutoff = INT64_MAX;
  if (k <= 0 || k >= n) {  // nothing to search: none, or every entry
    if (residual) make_u(residual, x, n, stream);
    init.done = 1;
    set_state<<<1, 1, 0, stream>>>(s.state, init);
    check_launch("set_state");
    return k <= 0 ? 0 : n;
  }
  // The CPU's sample: a contiguous middle block of max(n/100, 4096) elements.
  const int64_t sample = std::min<int64_t>(n, std::max<int64_t>(n / 100, 4096));
  if (sample == n) approx = false;
  const int64_t begin = approx ? (n - sample) / 2 : 0;
  const int64_t searched = approx ? sample : n;
  init.need = approx ? std::max<int64_t>(1, (k * sample + n - 1) / n) : k;
  set_state<<<1, 1, 0, stream>>>(s.state, init);
  check_launch("set_state");
  check(cudaMemsetAsync(s.hist, 0, sizeof(unsigned long long) * math::kRadixPasses * math::kRadixMaxBuckets, stream),
        "clearing the histograms");
  const float* u = residual ? residual : x;
  const unsigned grid = grid_for(searched, kThreads * kUnroll);
  for (int pass = 0; pass < math::kRadixPasses; ++pass) {
    unsigned long long* hist = s.hist + pass * math::kRadixMaxBuckets;
    int64_t* collect = pass == 1 && !approx ? s.candidates : nullptr;
    if (pass == 0 && residual && !approx) {
      radix_histogram<true><<<grid, kThreads, 0, stream>>>(x, residual, n, pass, s.state, hist, nullptr, false);
    } else {
      if (pass == 0 && residual) make_u(residual, x, n, stream);
      if (pass == 2 && !approx) {
        candidate_histogram<<<grid_for(s.candidate_capacity, kThreads), kThreads, 0, stream>>>(u, s.candidates, pass,
                                                                                              s.state, hist);
        check_launch("candidate_histogram");
      }
      radix_histogram<false><<<grid, kThreads, 0, stream>>>(u + begin, nullptr, searched, pass, s.state, hist, collect,
                                                            pass == 2 && !approx);
    }
    check_launch("radix_histogram");
    radix_boundary<<<1, kThreads, 0, stream>>>(hist, pass, !approx, s.candidate_capacity, s.state);
    check_launch("radix_boundary");
  }
  if (!approx) {
    const int64_t chunks = Scratch::tie_chunks(n);
    count_ties<<<blocks_for(chunks, 1), kThreads, 0, stream>>>(u, n, s.state, s.chunk_ties);
    check_launch("count_ties");
    find_tie_cutoff<<<1, kThreads, 0, stream>>>(u, n, s.chunk_ties, chunks, s.state);
    check_launch("find_tie_cutoff");
    return k;
  }
  count_at_or_above<<<grid_for(n, kThreads), kThreads, 0, stream>>>(u, n, s.state);
  check_launch("count_at_or_above");
  unsigned long long count = 0;
  check(cudaMemcpyAsync(&count, &s.state->approx_count, sizeof count, cudaMemcpyDeviceToHost, stream),
        "reading the approximate count");
  check(cudaStreamSynchronize(stream), "top-k threshold");
  return static_cast<int64_t>(count);
}

void topk_compact(const float* u, int64_t n, int64_t* indices, void* scratch, cudaStream_t stream) {
  if (n <= 0) return;
  Scratch s(scratch, n);
  check(cub::DeviceSelect::If(s.cub_temp, s.cub_bytes, thrust::counting_iterator<int64_t>(0), indices, s.selected, n,
                              ChosenByThreshold{u, s.state}, stream),
        "cub::DeviceSelect::If");
}

Selection select_on_device(const SelectionParameters& codec, const float* x, int64_t n, float* residual,
                           DeviceArena& arena, cudaStream_t stream) {
  const int64_t k = count_for_density(codec.density, n);
  void* scratch = arena.allocate(topk_scratch_bytes(n));
  int64_t count = topk_prepare(x, residual, n, k, codec.approx, scratch, stream);
  // As on the CPU: an approximate threshold that lets too many through gives way to the
  // exact selection from u, which the first call left in `residual` (or is x).
  if (count > max_selected(codec, n)) count = topk_prepare(residual ? residual : x, nullptr, n, k, false, scratch, stream);
  auto* indices = static_cast<int64_t*>(arena.allocate(8 * static_cast<size_t>(count > 0 ? count : 1)));
  const float* u = residual ? residual : x;
  if (count > 0) topk_compact(u, n, indices, scratch, stream);
  return {u, indices, count};
}

}  // namespace gradzip::cuda
