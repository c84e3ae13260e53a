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
    thread_local std::vector<uint8_t> payload;
    payload.clear();
    codec_->encode(x.data_ptr<float>(), x.numel(), residual.defined() ? residual.data_ptr<float>() : nullptr, ctx,
                   payload);
    write_slot(payload.data(), payload.size(), slot.data_ptr<uint8_t>(), slot.numel());
  }

  void decode_add(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
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

 private:
  std::shared_ptr<const Codec> codec_;
};

// A context of its own for each chunk and phase, so that random draws (random-k's
// choice, QSGD's rounding) of different chunks are independent.
EncodeContext chunk_context(const EncodeContext& ctx, uint64_t phase, int chunk) {
  uint64_t z = ctx.seed + 0x9E3779B97F4A7C15ull * (2 * static_cast<uint64_t>(chunk) + phase + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return {z ^ (z >> 31), ctx.step, ctx.rank};
}

// The length of the longest two-phase chunk: ⌈n/ranks⌉.
int64_t largest_chunk(int64_t n, int ranks) { return exchange_chunk(n, ranks, 0).length + (n % ranks != 0); }

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

at::Tensor bytes_on(const at::Device& device, int64_t bytes, Buffer role) {
  if (!device.is_cpu()) return at::empty({bytes}, at::dtype(at::kByte).device(device));
  thread_local std::array<at::Tensor, static_cast<size_t>(Buffer::kCount)> kept;
  at::Tensor& buffer = kept[static_cast<size_t>(role)];
  if (!buffer.defined() || buffer.numel() < bytes) buffer = at::empty({bytes}, at::kByte);
  return buffer.narrow(0, 0, bytes);
}

// all-gather and all-to-all of byte slots, from and to the codec's device, through
// buffers on the transport's device.
at::Tensor allgather_slots(const at::Tensor& mine, int ranks, const ExchangeCall& call,
                           const c10::intrusive_ptr<c10d::Backend>& transport) {
  at::Tensor all = bytes_on(call.transport_device, ranks * mine.numel(), Buffer::kAll);
  at::Tensor send = mine.to(call.transport_device);
  transport->_allgather_base(all, send)->wait();
  return all.to(call.x.device());
}

at::Tensor alltoall_slots(const at::Tensor& slots, const ExchangeCall& call,
                          const c10::intrusive_ptr<c10d::Backend>& transport) {
  at::Tensor received = bytes_on(call.transport_device, slots.numel(), Buffer::kReceived);
  at::Tensor send = slots.to(call.transport_device);
  std::vector<int64_t> equal;
  transport->alltoall_base(received, send, equal, equal)->wait();
  return received.to(call.x.device());
}

// Chunk j of this rank's vector (with its part of the worker residual), encoded into a
// slot of `stride` bytes, goes to rank j. Returns the P pieces of chunk `rank` this rank
// received, slot r from rank r.
at::Tensor scatter_chunks(const TensorCodec& codec, const ExchangeCall& call, int64_t stride,
                          const c10::intrusive_ptr<c10d::Backend>& transport) {
  const int ranks = transport->getSize();
  const int64_t n = call.x.numel();
  at::Tensor send = bytes_on(call.x.device(), ranks * stride, Buffer::kSend);
  for (int j = 0; j < ranks; ++j) {
    const Chunk c = exchange_chunk(n, ranks, j);
    const at::Tensor residual =
        call.worker_residual.defined() ? call.worker_residual.narrow(0, c.begin, c.length) : at::Tensor();
    codec.encode(call.x.narrow(0, c.begin, c.length), residual, chunk_context(call.ctx, 0, j),
                 send.narrow(0, j * stride, stride));
  }
  return alltoall_slots(send, call, transport);
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

void write_slot(const uint8_t* payload, size_t size, uint8_t* slot, int64_t slot_bytes) {
  check_slot_fits(static_cast<int64_t>(size), slot_bytes);
  const uint64_t declared = size;
  std::memcpy(slot, &declared, 8);
  std::memcpy(slot + kSlotHeaderBytes, payload, size);
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

ExchangeCost exchange_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks) {
  const int64_t others = ranks - 1;
  return {ring_allreduce_bytes(n * element_bytes, ranks), others * slot_bytes(codec, n),
          2 * others * slot_bytes(codec, largest_chunk(n, ranks))};
}

ReduceScatterCost reduce_scatter_cost(const Codec& codec, int64_t n, int64_t element_bytes, int ranks) {
  const int64_t others = ranks - 1;
  return {ranks <= 1 ? 0 : others * (n * element_bytes / ranks), others * slot_bytes(codec, largest_chunk(n, ranks))};
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
  const at::Tensor all = allgather_slots(mine, ranks, call, transport);
  sum.zero_();
  try {
    codec.decode_add(all, stride, ranks, sum, call.scale);
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
  const int64_t stride = slot_bytes(host, largest_chunk(n, ranks));
  const at::Tensor pieces = scatter_chunks(codec, call, stride, transport);

  // This rank owns chunk `rank`: the sum of its P pieces, in rank order, re-encoded.
  const Chunk owned = exchange_chunk(n, ranks, rank);
  at::Tensor mine = bytes_on(call.x.device(), stride, Buffer::kMine);
  at::Tensor owned_sum = bytes_on(call.x.device(), 4 * owned.length, Buffer::kOwnedSum).view(at::kFloat).zero_();
  // Whatever fails here, this rank still joins the all-gather (with a failed slot), so
  // that the others raise instead of waiting for it.
  std::optional<SlotError> undecodable;
  std::string failure;
  try {
    codec.decode_add(pieces, stride, ranks, owned_sum);
    if (call.majority) owned_sum.sign_();
    codec.encode(owned_sum, call.owner_residual, chunk_context(call.ctx, 1, rank), mine);
  } catch (const SlotError& e) {
    undecodable = e;
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (undecodable || !failure.empty()) mark_failed_slot(mine);

  // Phase 2: every owner's chunk to everybody.
  const at::Tensor all = allgather_slots(mine, ranks, call, transport);
  if (undecodable) raise_for_slot(*undecodable, call.key, "the piece");
  TORCH_CHECK(failure.empty(), "gradzip: re-encoding the reduced chunk failed: ", failure);
  sum.zero_();
  for (int j = 0; j < ranks; ++j) {
    const Chunk c = exchange_chunk(n, ranks, j);
    try {
      codec.decode_add(all.narrow(0, j * stride, stride), stride, 1, sum.narrow(0, c.begin, c.length), call.scale);
    } catch (const SlotError& e) {
      raise_for_slot(SlotError(j, e.what()), call.key, "the reduced chunk");
    }
  }
  return 2 * (ranks - 1) * stride;
}

int64_t compressed_reduce_scatter(const TensorCodec& codec, const Codec& host, const ExchangeCall& call,
                                  at::Tensor shard, const c10::intrusive_ptr<c10d::Backend>& transport) {
  const int ranks = transport->getSize();
  const int64_t stride = slot_bytes(host, largest_chunk(call.x.numel(), ranks));
  const at::Tensor pieces = scatter_chunks(codec, call, stride, transport);
  shard.zero_();
  try {
    codec.decode_add(pieces, stride, ranks, shard, call.scale);
  } catch (const SlotError& e) {
    raise_for_slot(e, call.key, "the piece");
  }
  return (ranks - 1) * stride;
}

}  // namespace gradzip
