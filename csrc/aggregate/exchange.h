// Exchange: how a compressed all-reduce moves its payloads between the ranks, the same
// code for CPU and CUDA tensors (a TensorCodec encodes and decodes on the tensor's
// device; the transport moves the bytes).
//
// one-shot: every rank encodes its whole vector; the payloads are all-gathered; every
//   rank decodes all P of them in rank order. Sends (P − 1)·c(n) bytes per rank.
// two-phase: every rank encodes its vector as P chunks (chunk j = elements
//   [⌊j·n/P⌋, ⌊(j+1)·n/P⌋)), all-to-all; rank j decodes the P pieces of chunk j in rank
//   order into fp32, adds its owner residual, re-encodes (its owner residual keeps what
//   that encoding did not carry) and all-gathers; every rank decodes the P chunks.
//   Sends 2·(P − 1)·c(n/P) bytes per rank: flat in P.
//   Pipelined in rounds: each chunk is cut into S sub-pieces (sub-piece s of chunk j =
//   exchange_chunk(chunk j's length, S, s) within it) and round s moves sub-piece s of
//   every chunk, through both phases. Every round's all-to-all is started as soon as it
//   is encoded and every round's all-gather as soon as its owner part is re-encoded, so
//   the transport moves round s while the codec works on round s + 1 (the transport's
//   collectives are asynchronous: Gloo's and MPI's run on threads of their own, NCCL's
//   on its stream). Chunks, ownership and owner residuals do not depend on S; an
//   element-wise codec (identity, fp16, bf16, sign without blocks) gives the same bits
//   for every S, a codec that selects or scales per block selects per sub-piece.
// dense: the transport's own all-reduce, 2·(P − 1)/P·n·(element size) bytes per rank.
// reduce-scatter: two-phase's first half; rank j ends with the sum of chunk j, decoded
//   in rank order into fp32. Sends (P − 1)·c(n/P) bytes per rank, against the ring's
//   (P − 1)/P·n·(element size). Any n and P: chunks differ by one element at most, no
//   padding is sent.
//
// Payloads travel in slots of a size known from the codec and n (no size exchange):
// a u64 length, the payload, zero padding to a multiple of 8 bytes. All ranks decode the
// same payloads in the same order, so all end bitwise identical. A payload that cannot
// be decoded raises on every rank: in two-phase, an owner that cannot decode a piece
// sends a failed slot, which every rank reports.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>
#include <stdexcept>
#include <string>

#include "gradzip/codec.h"

namespace gradzip {

enum class ExchangeScheme { kDense, kOneShot, kTwoPhase };
const char* exchange_name(ExchangeScheme scheme);

// What a spec's `exchange` key asks for: auto, oneshot or twophase.
enum class ExchangeRequest { kAuto, kOneShot, kTwoPhase };
ExchangeRequest parse_exchange_request(const std::string& value);
// The request of a compressed spec's `exchange` key (auto when it has none).
ExchangeRequest exchange_request(const Spec& spec);

// The rounds of a two-phase exchange (or a compressed reduce-scatter) of n elements over
// `ranks`: `requested` when it is above 0 (the spec's `rounds` key), else automatic:
// one round per kRoundBytes of what a rank sends in the first phase, at most kMaxRounds,
// and at most one per kMinRoundElements of a chunk. Never more rounds than elements in
// the smallest chunk, never fewer than one.
constexpr int64_t kRoundBytes = int64_t{4} << 20;
constexpr int kMaxRounds = 8;
constexpr int64_t kMinRoundElements = 4096;
int exchange_rounds(const Codec& codec, int64_t n, int ranks, int64_t requested = 0);
// The spec's `rounds` key: 0 (automatic) when it has none.
int64_t rounds_request(const Spec& spec);

// Bytes one rank sends for an all-reduce of n elements of `element_bytes` each over
// `ranks` ranks, by each scheme (slot framing included; two-phase in `rounds` rounds).
struct ExchangeCost {
  int64_t dense;
  int64_t oneshot;
  int64_t twophase;
  int rounds;
};
ExchangeCost exchange_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks,
                           int64_t rounds_requested = 0);

// Bytes one rank sends for a reduce-scatter of n elements over `ranks` ranks: the
// transport's ring, and the compressed exchange (slot framing included).
struct ReduceScatterCost {
  int64_t dense;
  int64_t compressed;
};
ReduceScatterCost reduce_scatter_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks,
                                      int64_t rounds_requested = 0);

// auto: the scheme that sends the fewest bytes, dense when neither compressed scheme
// sends fewer than the dense ring (ties go to dense, then one-shot). oneshot and
// twophase are taken as asked.
ExchangeScheme choose_exchange(ExchangeRequest request, const ExchangeCost& cost);

// Chunk j of n elements split over `ranks`: [begin, begin + length), begin = ⌊j·n/ranks⌋.
struct Chunk {
  int64_t begin;
  int64_t length;
};
Chunk exchange_chunk(int64_t n, int ranks, int j);

// A payload that could not be decoded: the row (rank) it came from, and why.
class SlotError : public std::runtime_error {
 public:
  SlotError(int row, const std::string& what) : std::runtime_error(what), row_(row) {}
  int row() const { return row_; }

 private:
  int row_;
};

// Slots: a u64 payload size, the payload, zero padding. A failed slot (size
// kFailedSlot) is what an owner sends when it could not decode a piece.
constexpr int64_t kSlotHeaderBytes = 8;
constexpr uint64_t kFailedSlot = ~uint64_t{0};
// The bytes of a slot that holds any payload of `codec` for n elements.
int64_t slot_bytes(const Codec& codec, int64_t n);
// Asserts that a payload of `size` bytes fits a slot of `slot_bytes` (the codec's bound).
void check_slot_fits(int64_t size, int64_t slot_bytes);
// Closes a slot in host memory whose payload of `size` bytes was written in place at
// slot + kSlotHeaderBytes: declares the size and zeroes the padding after it.
void seal_slot(size_t size, uint8_t* slot, int64_t slot_bytes);
// The payload size a slot of `slot_bytes` declares, checked; throws SlotError(row).
size_t slot_payload_size(uint64_t declared, int64_t slot_bytes, int row);
// Marks a slot (uint8 tensor, any device) failed.
void mark_failed_slot(at::Tensor slot);

// A codec on the tensors of one device.
class TensorCodec {
 public:
  virtual ~TensorCodec() = default;
  // Encodes x (contiguous float32) into `slot` (uint8, slot_bytes(codec, x.numel()));
  // with a defined `residual` (float32, x.numel(), same device) with error feedback.
  virtual void encode(const at::Tensor& x, const at::Tensor& residual, const EncodeContext& ctx,
                      at::Tensor slot) const = 0;
  // Sets `sum` (contiguous float32) to scale × the payloads of `rows` slots, slot r at
  // byte r·stride of `slots`, added to zeros in order r = 0, 1, ... as the codec's
  // decode_add(..., scale) adds them (a GPU codec without a one-pass decode may apply the
  // scale to the sum instead: the same bits on every rank of one device). Throws
  // SlotError naming the first slot that cannot be decoded (a failed slot included).
  virtual void decode_sum(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum,
                          float scale = 1.0f) const = 0;
  // Sets targets[r] to scale × the payload of slot r alone, for r = 0 .. targets.size() − 1
  // (the owners' reduced pieces: each its own part of the result). Throws SlotError naming
  // the first slot that cannot be decoded.
  virtual void decode_each(const at::Tensor& slots, int64_t stride, const std::vector<at::Tensor>& targets,
                           float scale) const = 0;
};

// The TensorCodec for tensors on `device`: the codec's CPU code, or its device half on a
// GPU (CUDA builds; the codec must have one).
std::unique_ptr<TensorCodec> tensor_codec(const std::shared_ptr<const Codec>& codec, const at::Device& device);

// One all-reduce's inputs. `x`: contiguous float32 on the codec's device, read before
// anything is written to `sum`, so the two may be the same tensor. The residuals are
// undefined without error feedback; `owner_residual` (two-phase) has the length of this
// rank's chunk.
struct ExchangeCall {
  at::Tensor x;
  at::Tensor worker_residual;
  at::Tensor owner_residual;
  EncodeContext ctx;
  bool majority = false;  // two-phase owners vote: sign of the sum of their pieces
  float scale = 1.0f;     // the result is scale × the sum (AVG: 1/P), applied as it is decoded
  int64_t rounds = 0;     // two-phase and reduce-scatter rounds asked for (0: exchange_rounds decides)
  const std::string* key = nullptr;  // names the tensor in error messages
  // Where the transport takes its buffers (NCCL: the GPU, also for a codec that runs
  // on the host); slots are copied there and back when it is not x's device.
  at::Device transport_device = at::kCPU;
};

// Writes scale × the sum over the ranks into `sum` (contiguous float32, n elements, on
// the codec's device) and returns the bytes this rank sent.
int64_t oneshot_allreduce(const TensorCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                          const c10::intrusive_ptr<c10d::Backend>& transport);
int64_t twophase_allreduce(const TensorCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                           const c10::intrusive_ptr<c10d::Backend>& transport);

// Writes scale × the sum over the ranks of chunk `rank` of x (exchange_chunk) into
// `shard` (contiguous float32 of that length, on the codec's device) and returns the
// bytes this rank sent. The owner_residual and majority fields are not used. A piece
// that cannot be decoded raises on its owner only (no rank hears back from another).
int64_t compressed_reduce_scatter(const TensorCodec& codec, const Codec& host, const ExchangeCall& call,
                                  at::Tensor shard, const c10::intrusive_ptr<c10d::Backend>& transport);

}  // namespace gradzip
