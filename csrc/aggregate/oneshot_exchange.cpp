// One-shot: every rank encodes its whole vector; the payloads are all-gathered; every
// rank decodes all P of them in rank order. Sends (P − 1)·c(n) bytes per rank. No rank
// owns anything: one compression per element, no second stage.
// Pipelined in rounds (oneshot_rounds): the vector is cut into S consecutive pieces and
// round s's all-gather is started as soon as piece s is encoded, so the transport moves
// round s while the codec encodes round s + 1, and decodes round s while later rounds are
// still on the wire. Every piece is encoded, and its all-gather started, before anything
// is decoded, so x may be the sum. An element-wise codec gives the same bits for every
// S; a codec that selects or scales per block does so per piece, and one that draws at
// random draws each piece's own (chunk_context). One round keeps the call's context.
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

#include "aggregate/exchange_flights.h"

namespace gradzip {
namespace {

class OneShotExchange final : public Exchange {
 public:
  Chunk owned(int64_t, int, int) const override { return {0, 0}; }
  int64_t allreduce(const SlotCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                    const c10::intrusive_ptr<c10d::Backend>& transport) const override {
    const int ranks = transport->getSize();
    const int64_t n = call.x.numel();
    const int rounds = oneshot_rounds(host, n, ranks, call.rounds);
    // Each round's piece and its codec, made once for the encode and the decode.
    std::vector<Chunk> pieces;
    std::vector<PartCodec> codecs;
    pieces.reserve(rounds);
    codecs.reserve(rounds);
    int64_t stride = 0;
    for (int s = 0; s < rounds; ++s) {
      pieces.push_back(exchange_chunk(n, rounds, s));
      codecs.emplace_back(codec, pieces.back());
      stride = std::max(stride, codecs.back()->slot_bytes(pieces.back().length));
    }
    const at::Tensor mine = bytes_on(call.x.device(), rounds * stride, Buffer::kMine);
    const at::Tensor all = bytes_on(call.transport_device, rounds * ranks * stride, Buffer::kAll);
    Flights flights(call);
    for (int s = 0; s < rounds; ++s) {
      const Chunk& c = pieces[s];
      const at::Tensor residual =
          call.worker_residual.defined() ? call.worker_residual.narrow(0, c.begin, c.length) : at::Tensor();
      const at::Tensor slot = mine.narrow(0, s * stride, stride);
      codecs[s]->encode(call.x.narrow(0, c.begin, c.length), residual,
                        rounds == 1 ? call.ctx : chunk_context(call.ctx, 0, 0, s, c.begin), slot);
      flights.start_allgather(slot, all.narrow(0, s * ranks * stride, ranks * stride), transport);
    }
    for (int s = 0; s < rounds; ++s) {
      const at::Tensor round = flights.finish(s);
      at::Tensor part_sum = sum.narrow(0, pieces[s].begin, pieces[s].length);
      try {
        if (call.sum_zeroed) {
          codecs[s]->decode_add(round, stride, ranks, part_sum, call.scale);
        } else {
          codecs[s]->decode_sum(round, stride, ranks, part_sum, call.scale);
        }
      } catch (const SlotError& e) {
        raise_for_slot(e, call.key, "the payload");
      }
    }
    return (ranks - 1) * rounds * stride;
  }
};

}  // namespace

const ExchangeScheme& oneshot_scheme() {
  static const ExchangeScheme scheme = {
      "oneshot", "all-gather", /*compresses_twice=*/false, /*in_rounds=*/false,
      [](const Codec& codec, int64_t n, int ranks, int64_t rounds_requested) {
        const int rounds = oneshot_rounds(codec, n, ranks, rounds_requested);
        return (ranks - 1) * rounds * slot_bytes(codec, largest_chunk(n, rounds));
      },
      []() -> const Exchange& {
        static const OneShotExchange exchange;
        return exchange;
      }};
  return scheme;
}

}  // namespace gradzip
