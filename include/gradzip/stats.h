// Byte accounting of one process group: what its all-reduces and reduce-scatters put on
// the wire,
// and what a dense fp32 ring of the same tensors would have sent.
#pragma once

#include <atomic>
#include <cstdint>

namespace gradzip {

struct StatsSnapshot {
  int64_t calls = 0;           // all_reduce and reduce_scatter calls
  int64_t bytes_sent = 0;      // bytes this rank sent
  int64_t bytes_received = 0;  // bytes this rank received
  int64_t dense_bytes = 0;     // bytes this rank would send with a dense fp32 ring
};

// Thread-safe counters; every aggregation adds to the Stats of its process group.
class Stats {
 public:
  void add(int64_t sent, int64_t received, int64_t dense) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    sent_.fetch_add(sent, std::memory_order_relaxed);
    received_.fetch_add(received, std::memory_order_relaxed);
    dense_.fetch_add(dense, std::memory_order_relaxed);
  }
  // Bytes a call moved besides its payloads (layers=adapt's error tables): no call of their own.
  void add_traffic(int64_t sent, int64_t received) {
    sent_.fetch_add(sent, std::memory_order_relaxed);
    received_.fetch_add(received, std::memory_order_relaxed);
  }
  StatsSnapshot snapshot() const {
    return {calls_.load(), sent_.load(), received_.load(), dense_.load()};
  }
  void reset() {
    calls_ = 0;
    sent_ = 0;
    received_ = 0;
    dense_ = 0;
  }

 private:
  std::atomic<int64_t> calls_{0}, sent_{0}, received_{0}, dense_{0};
};

// Bytes each rank sends (and receives) in a ring all-reduce of `bytes` over `ranks`
// ranks: a reduce-scatter and an allgather, each (ranks-1)/ranks of the data.
inline int64_t ring_allreduce_bytes(int64_t bytes, int ranks) {
  return ranks <= 1 ? 0 : 2 * (ranks - 1) * bytes / ranks;
}

}  // namespace gradzip
