#include "aggregate/exchange.h"

#include <c10/util/Exception.h>

#include <array>
#include <cstring>
#include <optional>
#include <vector>

#include "gradzip/stats.h"
#ifdef GRADZIP_WITH_CUDA
#include "aggregate/device_codec_glue.h"
#endif

namespace gradzip {
namespace {

// The codec's CPU code on CPU tensors.
class HostTensorCodec final : public TensorCodec {
 public:
  explicit HostTensorCodec(std::shared_ptr<const Codec> codec) : codec_(std::move(codec)) {}

  void encode(const at::Tensor& x, const at::Tensor& residual, const EncodeContext& ctx,
              at::Tensor slot) const override {
    uint8_t* at = slot.data_ptr<uint8_t>();
    const size_t size =
        codec_->encode_into(x.data_ptr<float>(), x.numel(), residual.defined() ? residual.data_ptr<float>() : nullptr,
                            ctx, at + kSlotHeaderBytes, static_cast<size_t>(slot.numel() - kSlotHeaderBytes));
    seal_slot(size, at, slot.numel());
  }

  void decode_sum(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    sum.zero_();
    const uint8_t* base = slots.data_ptr<uint8_t>();
    for (int r = 0; r < rows; ++r) {
      const uint8_t* slot = base + r * stride;
      uint64_t declared;
      std::memcpy(&declared, slot, 8);
      const size_t size = slot_payload_size(declared, stride, r);
      try {
        codec_->decode_add(slot + kSlotHeaderBytes, size, sum.data_ptr<float>(), sum.numel(), scale);
      } catch (const PayloadError& e) {
        throw SlotError(r, e.what());
      }
    }
  }

  void decode_each(const at::Tensor& slots, int64_t stride, const std::vector<at::Tensor>& targets,
                   float scale) const override {
    for (size_t r = 0; r < targets.size(); ++r) {
      try {
        decode_sum(slots.narrow(0, static_cast<int64_t>(r) * stride, stride), stride, 1, targets[r], scale);
      } catch (const SlotError& e) {
        throw SlotError(static_cast<int>(r), e.what());
      }
    }
  }

 private:
  std::shared_ptr<const Codec> codec_;
};

// A context of its own for each chunk, phase and round, so that random draws (random-k's
// choice, QSGD's rounding) of different pieces are independent. Round 0 keeps the
// context a one-round exchange always had.
EncodeContext chunk_context(const EncodeContext& ctx, uint64_t phase, int chunk, int round = 0) {
  uint64_t z = ctx.seed + 0x9E3779B97F4A7C15ull * (2 * static_cast<uint64_t>(chunk) + phase + 1) +
               0xD1B54A32D192ED03ull * static_cast<uint64_t>(round);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return {z ^ (z >> 31), ctx.step, ctx.rank};
}

// The length of the longest two-phase chunk: ⌈n/ranks⌉.
int64_t largest_chunk(int64_t n, int ranks) { return exchange_chunk(n, ranks, 0).length + (n % ranks != 0); }

// The longest sub-piece of any chunk in any of `rounds` rounds.
int64_t largest_piece(int64_t n, int ranks, int rounds) { return largest_chunk(largest_chunk(n, ranks), rounds); }

// Sub-piece `round` of chunk j, in the elements of the whole vector.
Chunk round_piece(int64_t n, int ranks, int j, int rounds, int round) {
  const Chunk chunk = exchange_chunk(n, ranks, j);
  const Chunk piece = exchange_chunk(chunk.length, rounds, round);
  return {chunk.begin + piece.begin, piece.length};
}

[[noreturn]] void raise_for_slot(const SlotError& e, const std::string* key, const char* what) {
  TORCH_CHECK(false, "gradzip: ", what, " of rank ", e.row(), " for the tensor keyed '", key ? *key : "?",
              "' cannot be decoded: ", e.what());
}

// The exchange's buffers (bytes; the owner's sum viewed as floats), by their role in a
// call. On the CPU each thread keeps its buffers from call to call (a call uses them only
// until it returns): fresh allocations of this size come from mmap, and their first
// touch costs more than the codec's own passes. GPU memory comes from torch's caching
// allocator.
enum class Buffer { kMine, kSend, kReceived, kAll, kOwnedSum, kCount };

std::array<at::Tensor, static_cast<size_t>(Buffer::kCount)>& kept_buffers() {
  thread_local std::array<at::Tensor, static_cast<size_t>(Buffer::kCount)> kept;
  return kept;
}

at::Tensor bytes_on(const at::Device& device, int64_t bytes, Buffer role) {
  if (!device.is_cpu()) return at::empty({bytes}, at::dtype(at::kByte).device(device));
  at::Tensor& buffer = kept_buffers()[static_cast<size_t>(role)];
  if (!buffer.defined() || buffer.numel() < bytes) buffer = at::empty({bytes}, at::kByte);
  return buffer.narrow(0, 0, bytes);
}

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
class Rounds {
 public:
  explicit Rounds(const ExchangeCall& call) : call_(call) {}
  Rounds(const Rounds&) = delete;
  Rounds& operator=(const Rounds&) = delete;
  ~Rounds() {
    for (const auto& flight : flights_) {
      if (flight.work) {
        kept_buffers().fill(at::Tensor());
        return;
      }
    }
  }

  // all-to-all of `slots` (P slots of equal size; slot j goes to rank j) into `received`.
  void start_alltoall(const at::Tensor& slots, at::Tensor received,
                      const c10::intrusive_ptr<c10d::Backend>& transport) {
    at::Tensor send = slots.to(call_.transport_device);
    std::vector<int64_t> equal;
    flights_.push_back({transport->alltoall_base(received, send, equal, equal), received});
  }
  // all-gather of one slot from each rank into `all`.
  void start_allgather(const at::Tensor& mine, at::Tensor all, const c10::intrusive_ptr<c10d::Backend>& transport) {
    at::Tensor send = mine.to(call_.transport_device);
    flights_.push_back({transport->_allgather_base(all, send), all});
  }
  at::Tensor finish(size_t i) {
    InFlight& flight = flights_.at(i);
    auto work = std::move(flight.work);
    work->wait();
    return flight.received.to(call_.x.device());
  }

 private:
  const ExchangeCall& call_;
  std::vector<InFlight> flights_;
};

// Phase one in `rounds` rounds: in round s, sub-piece s of chunk j of this rank's vector
// (with its part of the worker residual), encoded into a slot of `stride` bytes, goes to
// rank j. Started in `flights` as flights 0 .. rounds − 1; each receives, slot r from
// rank r, the P sub-pieces of this rank's chunk.
void scatter_rounds(const TensorCodec& codec, const ExchangeCall& call, int rounds, int64_t stride,
                    const c10::intrusive_ptr<c10d::Backend>& transport, Rounds& flights) {
  const int ranks = transport->getSize();
  const int64_t n = call.x.numel();
  const int64_t round_bytes = ranks * stride;
  const at::Tensor send = bytes_on(call.x.device(), rounds * round_bytes, Buffer::kSend);
  const at::Tensor received = bytes_on(call.transport_device, rounds * round_bytes, Buffer::kReceived);
  for (int s = 0; s < rounds; ++s) {
    for (int j = 0; j < ranks; ++j) {
      const Chunk c = round_piece(n, ranks, j, rounds, s);
      const at::Tensor residual =
          call.worker_residual.defined() ? call.worker_residual.narrow(0, c.begin, c.length) : at::Tensor();
      codec.encode(call.x.narrow(0, c.begin, c.length), residual, chunk_context(call.ctx, 0, j, s),
                   send.narrow(0, s * round_bytes + j * stride, stride));
    }
    flights.start_alltoall(send.narrow(0, s * round_bytes, round_bytes),
                           received.narrow(0, s * round_bytes, round_bytes), transport);
  }
}

}  // namespace

const char* exchange_name(ExchangeScheme scheme) {
  switch (scheme) {
    case ExchangeScheme::kDense:
      return "dense";
    case ExchangeScheme::kOneShot:
      return "oneshot";
    case ExchangeScheme::kTwoPhase:
      return "twophase";
  }
  return "?";
}

ExchangeRequest parse_exchange_request(const std::string& value) {
  if (value == "oneshot") return ExchangeRequest::kOneShot;
  if (value == "twophase") return ExchangeRequest::kTwoPhase;
  TORCH_CHECK(value == "auto", "gradzip: exchange must be auto, oneshot or twophase, got '", value, "'");
  return ExchangeRequest::kAuto;
}

ExchangeRequest exchange_request(const Spec& spec) {
  return parse_exchange_request(spec.get_string("exchange", "auto"));
}

int64_t slot_bytes(const Codec& codec, int64_t n) {
  return kSlotHeaderBytes + (static_cast<int64_t>(codec.max_payload_bytes(n)) + 7) / 8 * 8;
}

void check_slot_fits(int64_t size, int64_t slot_bytes) {
  TORCH_INTERNAL_ASSERT(size <= slot_bytes - kSlotHeaderBytes, "gradzip: a payload of ", size,
                        " bytes is larger than its codec's bound (", slot_bytes - kSlotHeaderBytes, ")");
}

void seal_slot(size_t size, uint8_t* slot, int64_t slot_bytes) {
  check_slot_fits(static_cast<int64_t>(size), slot_bytes);
  const uint64_t declared = size;
  std::memcpy(slot, &declared, 8);
  std::memset(slot + kSlotHeaderBytes + size, 0, slot_bytes - kSlotHeaderBytes - size);
}

size_t slot_payload_size(uint64_t declared, int64_t slot_bytes, int row) {
  if (declared == kFailedSlot) throw SlotError(row, "that rank could not decode a piece it received (its own error names it)");
  if (declared > static_cast<uint64_t>(slot_bytes - kSlotHeaderBytes)) {
    throw SlotError(row, "its slot declares " + std::to_string(declared) + " bytes, more than the " +
                             std::to_string(slot_bytes - kSlotHeaderBytes) + " a slot holds");
  }
  return static_cast<size_t>(declared);
}

void mark_failed_slot(at::Tensor slot) {
  slot.narrow(0, 0, kSlotHeaderBytes).fill_(0xFF);
  slot.narrow(0, kSlotHeaderBytes, slot.numel() - kSlotHeaderBytes).zero_();
}

Chunk exchange_chunk(int64_t n, int ranks, int j) {
  const auto at = [&](int i) { return static_cast<int64_t>(static_cast<__int128>(n) * i / ranks); };
  return {at(j), at(j + 1) - at(j)};
}

int exchange_rounds(const Codec& codec, int64_t n, int ranks, int64_t requested) {
  const int64_t smallest = ranks > 0 ? n / ranks : 0;
  int64_t rounds = requested;
  if (rounds <= 0) {
    const int64_t first_phase = (ranks - 1) * slot_bytes(codec, largest_chunk(n, ranks));
    rounds = std::min<int64_t>({first_phase / kRoundBytes, kMaxRounds, smallest / kMinRoundElements});
  }
  return static_cast<int>(std::max<int64_t>(1, std::min(rounds, smallest)));
}

int64_t rounds_request(const Spec& spec) { return spec.get_int("rounds", 0); }

ExchangeCost exchange_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks, int64_t rounds_requested) {
  const int64_t others = ranks - 1;
  const int rounds = exchange_rounds(codec, n, ranks, rounds_requested);
  return {ring_allreduce_bytes(n * element_bytes, ranks), others * slot_bytes(codec, n),
          2 * others * rounds * slot_bytes(codec, largest_piece(n, ranks, rounds)), rounds};
}

ReduceScatterCost reduce_scatter_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks,
                                      int64_t rounds_requested) {
  const int64_t others = ranks - 1;
  const int rounds = exchange_rounds(codec, n, ranks, rounds_requested);
  return {ranks <= 1 ? 0 : others * (n * element_bytes / ranks),
          others * rounds * slot_bytes(codec, largest_piece(n, ranks, rounds))};
}

ExchangeScheme choose_exchange(ExchangeRequest request, const ExchangeCost& cost) {
  if (request == ExchangeRequest::kOneShot) return ExchangeScheme::kOneShot;
  if (request == ExchangeRequest::kTwoPhase) return ExchangeScheme::kTwoPhase;
  if (cost.dense <= std::min(cost.oneshot, cost.twophase)) return ExchangeScheme::kDense;
  return cost.oneshot <= cost.twophase ? ExchangeScheme::kOneShot : ExchangeScheme::kTwoPhase;
}

std::unique_ptr<TensorCodec> tensor_codec(const std::shared_ptr<const Codec>& codec, const at::Device& device) {
#ifdef GRADZIP_WITH_CUDA
  if (device.is_cuda()) return device_tensor_codec(codec);
#endif
  TORCH_CHECK(device.is_cpu(), "gradzip: the ", codec->name(), " codec has no encoder for tensors on ", device);
  return std::make_unique<HostTensorCodec>(codec);
}

int64_t oneshot_allreduce(const TensorCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                          const c10::intrusive_ptr<c10d::Backend>& transport) {
  const int ranks = transport->getSize();
  const int64_t stride = slot_bytes(host, call.x.numel());
  at::Tensor mine = bytes_on(call.x.device(), stride, Buffer::kMine);
  codec.encode(call.x, call.worker_residual, call.ctx, mine);
  Rounds flights(call);
  flights.start_allgather(mine, bytes_on(call.transport_device, ranks * stride, Buffer::kAll), transport);
  const at::Tensor all = flights.finish(0);
  try {
    codec.decode_sum(all, stride, ranks, sum, call.scale);
  } catch (const SlotError& e) {
    raise_for_slot(e, call.key, "the payload");
  }
  return (ranks - 1) * stride;
}

int64_t twophase_allreduce(const TensorCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                           const c10::intrusive_ptr<c10d::Backend>& transport) {
  const int ranks = transport->getSize();
  const int rank = transport->getRank();
  const int64_t n = call.x.numel();
  const int rounds = exchange_rounds(host, n, ranks, call.rounds);
  const int64_t stride = slot_bytes(host, largest_piece(n, ranks, rounds));
  Rounds flights(call);
  scatter_rounds(codec, call, rounds, stride, transport, flights);

  // This rank owns chunk `rank`: in each round, the sum of its sub-piece's P pieces, in
  // rank order, re-encoded and all-gathered at once. Whatever fails here, this rank
  // still joins every all-gather (with failed slots), so that the others raise instead
  // of waiting for it.
  const Chunk owned = exchange_chunk(n, ranks, rank);
  const at::Tensor mine = bytes_on(call.x.device(), rounds * stride, Buffer::kMine);
  const at::Tensor all = bytes_on(call.transport_device, rounds * ranks * stride, Buffer::kAll);
  const at::Tensor owned_sum = bytes_on(call.x.device(), 4 * owned.length, Buffer::kOwnedSum).view(at::kFloat);
  std::optional<SlotError> undecodable;
  std::string failure;
  for (int s = 0; s < rounds; ++s) {
    const at::Tensor slot = mine.narrow(0, s * stride, stride);
    const Chunk part = exchange_chunk(owned.length, rounds, s);
    const at::Tensor pieces = flights.finish(s);
    if (!undecodable && failure.empty()) {
      try {
        at::Tensor part_sum = owned_sum.narrow(0, part.begin, part.length);
        codec.decode_sum(pieces, stride, ranks, part_sum);
        if (call.majority) part_sum.sign_();
        const at::Tensor residual =
            call.owner_residual.defined() ? call.owner_residual.narrow(0, part.begin, part.length) : at::Tensor();
        codec.encode(part_sum, residual, chunk_context(call.ctx, 1, rank, s), slot);
      } catch (const SlotError& e) {
        undecodable = e;
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    if (undecodable || !failure.empty()) mark_failed_slot(slot);
    flights.start_allgather(slot, all.narrow(0, s * ranks * stride, ranks * stride), transport);
  }

  // Phase two: every owner's sub-pieces to everybody, decoded round by round as they come.
  for (int s = 0; s < rounds; ++s) {
    const at::Tensor round = flights.finish(rounds + s);
    if (undecodable) raise_for_slot(*undecodable, call.key, "the piece");
    TORCH_CHECK(failure.empty(), "gradzip: re-encoding the reduced chunk failed: ", failure);
    std::vector<at::Tensor> pieces;
    for (int j = 0; j < ranks; ++j) {
      const Chunk c = round_piece(n, ranks, j, rounds, s);
      pieces.push_back(sum.narrow(0, c.begin, c.length));
    }
    try {
      codec.decode_each(round, stride, pieces, call.scale);
    } catch (const SlotError& e) {
      raise_for_slot(e, call.key, "the reduced chunk");
    }
  }
  return 2 * (ranks - 1) * rounds * stride;
}

int64_t compressed_reduce_scatter(const TensorCodec& codec, const Codec& host, const ExchangeCall& call,
                                  at::Tensor shard, const c10::intrusive_ptr<c10d::Backend>& transport) {
  const int ranks = transport->getSize();
  const int64_t n = call.x.numel();
  const int rounds = exchange_rounds(host, n, ranks, call.rounds);
  const int64_t stride = slot_bytes(host, largest_piece(n, ranks, rounds));
  Rounds flights(call);
  scatter_rounds(codec, call, rounds, stride, transport, flights);
  for (int s = 0; s < rounds; ++s) {
    const Chunk part = exchange_chunk(shard.numel(), rounds, s);
    const at::Tensor pieces = flights.finish(s);
    try {
      codec.decode_sum(pieces, stride, ranks, shard.narrow(0, part.begin, part.length), call.scale);
    } catch (const SlotError& e) {
      raise_for_slot(e, call.key, "the piece");
    }
  }
  return (ranks - 1) * rounds * stride;
}

}  // namespace gradzip
