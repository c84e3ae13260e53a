#include "aggregate/exchange_flights.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include <array>

namespace gradzip {
namespace {

std::array<at::Tensor, static_cast<size_t>(Buffer::kCount)>& kept_buffers() {
  thread_local std::array<at::Tensor, static_cast<size_t>(Buffer::kCount)> kept;
  return kept;
}

}  // namespace

[[noreturn]] void raise_for_slot(const SlotError& e, const std::string* key, const char* what) {
  TORCH_CHECK(false, "gradzip: ", what, " of rank ", e.row(), " for the tensor keyed '", key ? *key : "?",
              "' cannot be decoded: ", e.what());
}

at::Tensor bytes_on(const at::Device& device, int64_t bytes, Buffer role) {
  if (!device.is_cpu()) return at::empty({bytes}, at::dtype(at::kByte).device(device));
  at::Tensor& buffer = kept_buffers()[static_cast<size_t>(role)];
  if (!buffer.defined() || buffer.numel() < bytes) buffer = at::empty({bytes}, at::kByte);
  return buffer.narrow(0, 0, bytes);
}

Flights::~Flights() {
  for (const auto& flight : flights_) {
    if (flight.work) {
      kept_buffers().fill(at::Tensor());
      return;
    }
  }
}

void Flights::start_alltoall(const at::Tensor& slots, at::Tensor received,
                            const c10::intrusive_ptr<c10d::Backend>& transport) {
  at::Tensor send = slots.to(call_.transport_device);
  std::vector<int64_t> equal;
  flights_.push_back({transport->alltoall_base(received, send, equal, equal), received});
}

void Flights::start_allgather(const at::Tensor& mine, at::Tensor all,
                             const c10::intrusive_ptr<c10d::Backend>& transport) {
  at::Tensor send = mine.to(call_.transport_device);
  flights_.push_back({transport->_allgather_base(all, send), all});
}

at::Tensor Flights::finish(size_t i) {
  InFlight& flight = flights_.at(i);
  auto work = std::move(flight.work);
  work->wait();
  return flight.received.to(call_.x.device());
}

PhaseOne scatter_rounds(const SlotCodec& codec, const Codec& host, const ExchangeCall& call,
                        const c10::intrusive_ptr<c10d::Backend>& transport, Flights& flights) {
  const int ranks = transport->getSize();
  const int64_t n = call.x.numel();
  const int rounds = exchange_rounds(host, n, ranks, call.rounds);
  int64_t stride = slot_bytes(host, largest_piece(n, ranks, rounds));
  if (!codec.uniform()) {  // the largest of the sub-pieces' own codecs' slots
    stride = 0;
    for (int s = 0; s < rounds; ++s) {
      for (int j = 0; j < ranks; ++j) {
        const Chunk c = round_piece(n, ranks, j, rounds, s);
        stride = std::max(stride, PartCodec(codec, c)->slot_bytes(c.length));
      }
    }
  }
  const int64_t round_bytes = ranks * stride;
  const at::Tensor send = bytes_on(call.x.device(), rounds * round_bytes, Buffer::kSend);
  const at::Tensor received = bytes_on(call.transport_device, rounds * round_bytes, Buffer::kReceived);
  for (int s = 0; s < rounds; ++s) {
    if (call.before_round) call.before_round(s);
    for (int j = 0; j < ranks; ++j) {
      const Chunk c = round_piece(n, ranks, j, rounds, s);
      const at::Tensor residual =
          call.worker_residual.defined() ? call.worker_residual.narrow(0, c.begin, c.length) : at::Tensor();
      PartCodec(codec, c)->encode(call.x.narrow(0, c.begin, c.length), residual, chunk_context(call.ctx, 0, j, s, c.begin),
                                  send.narrow(0, s * round_bytes + j * stride, stride));
    }
    flights.start_alltoall(send.narrow(0, s * round_bytes, round_bytes),
                           received.narrow(0, s * round_bytes, round_bytes), transport);
  }
  return {rounds, stride};
}

}  // namespace gradzip
