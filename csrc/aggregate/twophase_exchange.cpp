// Two-phase: every rank encodes its vector as P chunks, all-to-all; rank j decodes the P
// pieces of chunk j in rank order into fp32, adds its owner residual, re-encodes (its
// owner residual keeps what that encoding did not carry) and all-gathers; every rank
// decodes the P chunks. Sends 2·(P − 1)·c(n/P) bytes per rank: flat in P. Its first
// half is the compressed reduce-scatter.
// Pipelined in rounds (aggregate/exchange_rounds.h): each chunk is cut into S sub-pieces
// and round s moves sub-piece s of every chunk, through both phases. Every round's
// all-to-all is started as soon as it is encoded and every round's all-gather as soon as
// its owner part is re-encoded, so the transport moves round s while the codec works on
// round s + 1 (the transport's collectives are asynchronous: Gloo's and MPI's run on
// threads of their own, NCCL's on its stream). Chunks, ownership and owner residuals do
// not depend on S; an element-wise codec (identity, fp16, bf16, sign without blocks)
// gives the same bits for every S, a codec that selects or scales per block selects per
// sub-piece. An owner that cannot decode a piece sends a failed slot, which every rank
// reports.
#include <c10/util/Exception.h>

#include <optional>

#include "aggregate/exchange_flights.h"

namespace gradzip {
namespace {

class TwoPhaseExchange final : public Exchange {
 public:
  Chunk owned(int64_t n, int ranks, int rank) const override { return exchange_chunk(n, ranks, rank); }
  int64_t allreduce(const SlotCodec& codec, const Codec& host, const ExchangeCall& call, at::Tensor sum,
                      const c10::intrusive_ptr<c10d::Backend>& transport) const override {
    const int ranks = transport->getSize();
    const int rank = transport->getRank();
    const int64_t n = call.x.numel();
    Flights flights(call);
    const auto [rounds, stride] = scatter_rounds(codec, host, call, transport, flights);

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
          const PartCodec part_codec(codec, round_piece(n, ranks, rank, rounds, s));
          at::Tensor part_sum = owned_sum.narrow(0, part.begin, part.length);
          part_codec->decode_sum(pieces, stride, ranks, part_sum);
          if (call.majority) part_sum.sign_();
          const at::Tensor residual =
              call.owner_residual.defined() ? call.owner_residual.narrow(0, part.begin, part.length) : at::Tensor();
          part_codec->encode(part_sum, residual, chunk_context(call.ctx, 1, rank, s, owned.begin + part.begin), slot);
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
        if (codec.uniform()) {
          codec.decode_each(round, stride, pieces, call.scale);
        } else {  // each owner's sub-piece by its own codec
          for (int j = 0; j < ranks; ++j) {
            try {
              PartCodec(codec, round_piece(n, ranks, j, rounds, s))
                  ->decode_each(round.narrow(0, j * stride, stride), stride, {pieces[j]}, call.scale);
            } catch (const SlotError& e) {
              throw SlotError(j, e.what());
            }
          }
        }
      } catch (const SlotError& e) {
        raise_for_slot(e, call.key, "the reduced chunk");
      }
    }
    return 2 * (ranks - 1) * rounds * stride;
  }
};

}  // namespace

const ExchangeScheme& twophase_scheme() {
  static const ExchangeScheme scheme = {
      "twophase", "all-to-all of chunks, owners reduce and re-encode, all-gather", /*compresses_twice=*/true,
      /*in_rounds=*/true,
      [](const Codec& codec, int64_t n, int ranks, int64_t rounds_requested) {
        const int rounds = exchange_rounds(codec, n, ranks, rounds_requested);
        return 2 * (ranks - 1) * rounds * slot_bytes(codec, largest_piece(n, ranks, rounds));
      },
      []() -> const Exchange& {
        static const TwoPhaseExchange exchange;
        return exchange;
      }};
  return scheme;
}

int64_t compressed_reduce_scatter(const SlotCodec& codec, const Codec& host, const ExchangeCall& call,
                                  at::Tensor shard, const c10::intrusive_ptr<c10d::Backend>& transport) {
  const int ranks = transport->getSize();
  Flights flights(call);
  const auto [rounds, stride] = scatter_rounds(codec, host, call, transport, flights);
  for (int s = 0; s < rounds; ++s) {
    const Chunk part = exchange_chunk(shard.numel(), rounds, s);
    const at::Tensor pieces = flights.finish(s);
    try {
      PartCodec(codec, round_piece(call.x.numel(), ranks, transport->getRank(), rounds, s))
          ->decode_sum(pieces, stride, ranks, shard.narrow(0, part.begin, part.length), call.scale);
    } catch (const SlotError& e) {
      raise_for_slot(e, call.key, "the piece");
    }
  }
  return (ranks - 1) * rounds * stride;
}

}  // namespace gradzip
