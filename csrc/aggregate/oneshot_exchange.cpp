// One-shot: every rank encodes its whole vector; the payloads are all-gathered; every
// rank decodes all P of them in rank order. Sends (P − 1)·c(n) bytes per rank. No rank
// owns anything: one compression per element, no second stage.
#include <c10/util/Exception.h>

#include "aggregate/exchange_flights.h"

namespace gradzip {
namespace {

class OneShotExchange final : public Exchange {
 public:
  Chunk owned(int64_t, int, int) const override { return {0, 0}; }
  int64_t allreduce(const SlotCodec& codec, const Codec&, const ExchangeCall& call, at::Tensor sum,
                      const c10::intrusive_ptr<c10d::Backend>& transport) const override {
    const int ranks = transport->getSize();
    const int64_t stride = codec.slot_bytes(call.x.numel());
    at::Tensor mine = bytes_on(call.x.device(), stride, Buffer::kMine);
    codec.encode(call.x, call.worker_residual, call.ctx, mine);
    Flights flights(call);
    flights.start_allgather(mine, bytes_on(call.transport_device, ranks * stride, Buffer::kAll), transport);
    const at::Tensor all = flights.finish(0);
    try {
      if (call.sum_zeroed) {
        codec.decode_add(all, stride, ranks, sum, call.scale);
      } else {
        codec.decode_sum(all, stride, ranks, sum, call.scale);
      }
    } catch (const SlotError& e) {
      raise_for_slot(e, call.key, "the payload");
    }
    return (ranks - 1) * stride;
  }
};

}  // namespace

const ExchangeScheme& oneshot_scheme() {
  static const ExchangeScheme scheme = {
      "oneshot", "all-gather", /*compresses_twice=*/false, /*in_rounds=*/false,
      [](const Codec& codec, int64_t n, int ranks, int) { return (ranks - 1) * slot_bytes(codec, n); },
      []() -> const Exchange& {
        static const OneShotExchange exchange;
        return exchange;
      }};
  return scheme;
}

}  // namespace gradzip
