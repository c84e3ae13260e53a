#include "codec/entry_codec.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "codec/cpu_features.h"

namespace gradzip {

namespace {

// Entries' buffers kept by a thread above this many entries are freed at its next call.
constexpr uint64_t kKeptEntries = uint64_t{1} << 22;
void drop_if_large(Entries& entries) {
  if (entries.positions.capacity() > kKeptEntries) entries = Entries();
}

// out[p] += v for each entry, the targets kScatterAhead entries further on prefetched, so
// that many of their cache misses are in flight at once: one per entry at 1%, where a
// plain loop waits on a few at a time (25M elements, 1%, on the AMD EPYC of
// docs/results.md, STC's decode: 19.4 ns per entry without, 17.9 with).
constexpr uint64_t kScatterAhead = 32;
void scatter_add(const Entries& entries, float* out) {
  const int64_t* positions = entries.positions.data();
  const float* values = entries.values.data();
  const uint64_t count = entries.count();
  const uint64_t ahead = count > kScatterAhead ? count - kScatterAhead : 0;
  uint64_t j = 0;
  for (; j < ahead; ++j) {
    __builtin_prefetch(out + positions[j + kScatterAhead], 1, 0);
    out[positions[j]] += values[j];
  }
  for (; j < count; ++j) out[positions[j]] += values[j];
}

// to[0, count) = from[0, count), `to` 32-byte aligned, past the caches.
__attribute__((target("avx2"))) void stream_copy(const float* from, float* to, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_stream_ps(to + i, _mm256_loadu_ps(from + i));
  for (; i < count; ++i) to[i] = from[i];
}

}  // namespace

void EntryCodec::decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const {
  thread_local Entries entries;
  drop_if_large(entries);
  decode_entries(data, size, n, scale, entries);
  scatter_add(entries, out);
}

std::vector<Entries>& thread_entry_rows(int rows) {
  thread_local std::vector<Entries> kept;
  for (Entries& entries : kept) drop_if_large(entries);
  kept.resize(static_cast<size_t>(rows));
  return kept;
}

void sum_rows_by_range(const std::vector<Entries>& rows, float* out, int64_t n) {
  const bool stream = kHasAvx2 && n * 4 >= kStreamBytes;
  // With streaming stores the first range ends where out reaches a 32-byte boundary, so
  // that every later one starts on one.
  const int64_t lead = stream ? static_cast<int64_t>((32 - reinterpret_cast<uintptr_t>(out) % 32) % 32 / 4) : 0;
  std::vector<uint64_t> next(rows.size(), 0);
  alignas(32) float range[kDecodeRange];
  for (int64_t begin = 0; begin < n;) {
    const int64_t end = std::min(n, begin + (begin == 0 && lead > 0 ? lead : kDecodeRange));
    std::fill(range, range + (end - begin), 0.0f);
    for (size_t r = 0; r < rows.size(); ++r) {
      const int64_t* positions = rows[r].positions.data();
      const float* values = rows[r].values.data();
      const uint64_t count = rows[r].count();
      uint64_t j = next[r];
      for (; j < count && positions[j] < end; ++j) range[positions[j] - begin] += values[j];
      next[r] = j;
    }
    if (stream && begin >= lead) {
      stream_copy(range, out + begin, end - begin);
    } else {
      std::memcpy(out + begin, range, static_cast<size_t>(end - begin) * sizeof(float));
    }
    begin = end;
  }
  if (stream) _mm_sfence();
}

}  // namespace gradzip
