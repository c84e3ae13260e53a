// What the exchange schemes share as they run (aggregate/*_exchange.cpp): each piece's
// codec, the thread's kept buffers, the collectives in flight, and phase one (the
// all-to-all of encoded chunks) that two-phase and the compressed reduce-scatter both
// start with. The chunks and rounds they move are planned in aggregate/exchange_rounds.h.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <string>
#include <vector>

#include "aggregate/exchange.h"

namespace gradzip {

// The codec of elements `c` of the vector: `codec` itself when it is uniform (the same
// everywhere), else its part (SlotCodec::part). Returns a reference valid while the
// holder lives.
class PartCodec {
 public:
  PartCodec(const SlotCodec& codec, const Chunk& c)
      : part_(codec.uniform() ? nullptr : codec.part(c.begin, c.length)), codec_(part_ ? *part_ : codec) {}
  const SlotCodec& operator*() const { return codec_; }
  const SlotCodec* operator->() const { return &codec_; }

 private:
  std::unique_ptr<SlotCodec> part_;
  const SlotCodec& codec_;
};

[[noreturn]] void raise_for_slot(const SlotError& e, const std::string* key, const char* what);

// The exchange's buffers (bytes; the owner's sum viewed as floats), by their role in a
// call. On the CPU each thread keeps its buffers from call to call (a call uses them only
// until it returns): fresh allocations of this size come from mmap, and their first
// touch costs more than the codec's own passes. GPU memory comes from torch's caching
// allocator.
enum class Buffer { kMine, kSend, kReceived, kAll, kOwnedSum, kNodeSend, kNodeReceived, kShard, kNodeMine, kNodeAll, kCount };
at::Tensor bytes_on(const at::Device& device, int64_t bytes, Buffer role);

// A collective of byte slots in flight on the transport, and the buffer it fills there.
struct InFlight {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor received;
};

// The collectives an exchange started. finish(i) waits for the i-th and returns what it
// received on the codec's device. An exchange that leaves with an error before it
// finished them all leaves this thread's kept buffers to the collectives still in
// flight (their Work holds the tensors) and takes fresh ones next time: waiting for
// them could take the group's timeout once per round.
class Flights {
 public:
  explicit Flights(const ExchangeCall& call) : call_(call) {}
  Flights(const Flights&) = delete;
  Flights& operator=(const Flights&) = delete;
  ~Flights();

  // all-to-all of `slots` (P slots of equal size; slot j goes to rank j) into `received`.
  void start_alltoall(const at::Tensor& slots, at::Tensor received,
                      const c10::intrusive_ptr<c10d::Backend>& transport);
  // all-gather of one slot from each rank into `all`.
  void start_allgather(const at::Tensor& mine, at::Tensor all, const c10::intrusive_ptr<c10d::Backend>& transport);
  at::Tensor finish(size_t i);

 private:
  const ExchangeCall& call_;
  std::vector<InFlight> flights_;
};

// Phase one in exchange_rounds(...) rounds: in round s, sub-piece s of chunk j of this
// rank's vector (with its part of the worker residual), encoded into a slot of `stride`
// bytes (every sub-piece's bound; each sub-piece's own codec, PartCodec), goes to rank j,
// after call.before_round(s) where the call has one. Started in `flights` as flights
// 0 .. rounds − 1; each receives, slot r from rank r, the P sub-pieces of this rank's
// chunk. Returns the rounds and the stride.
struct PhaseOne {
  int rounds;
  int64_t stride;
};
PhaseOne scatter_rounds(const SlotCodec& codec, const Codec& host, const ExchangeCall& call,
                        const c10::intrusive_ptr<c10d::Backend>& transport, Flights& flights);

}  // namespace gradzip
