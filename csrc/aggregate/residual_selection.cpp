#include "aggregate/residual_selection.h"

#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <optional>

#include "aggregate/compressed_residuals.h"
#include "aggregate/momentum_correction.h"
#include "codec/codec_record.h"
#include "codec/cpu_features.h"
#include "codec/element_math.cuh"
#include "codec/selection_codec.h"
#include "codec/topk_select.h"

namespace gradzip {
namespace {

// A piece's candidates as the pass finds them: (key, index in the piece), up to one past
// candidate_cap (then select_from_candidates declines and the codec selects itself).
struct Collector {
  std::vector<std::pair<uint32_t, int64_t>>& candidates;
  size_t cap;
  int64_t origin;  // the piece's first element
  bool full = false;
  void take(uint32_t key, int64_t i) {
    if (full) return;
    candidates.emplace_back(key, i - origin);
    full = candidates.size() > cap;
  }
};

// The pass over elements [begin, end): with a velocity (kMomentum), v' = v·m + x into
// sv (mul then add, no FMA, as add_momentum) and u = r + v'; else u = r + x (as the
// encoder's residual[i] += x[i] rounds); u written to w; keys at or above `lowest`
// collected (kCollect). Returns true when some x was Inf or NaN (the only floats whose
// exponent is all ones). x is only read: the decode writes the sum over it
// (EntryCodec's sum_rows_by_range, no zero fill first).
struct Rows {
  const float* r;
  const float* x;
  float* w;
  const float* v;  // with momentum
  float* sv;
  float m;
};

template <bool kMomentum, bool kCollect>
bool pass_scalar(const Rows& a, int64_t begin, int64_t end, Collector* collector, uint32_t lowest) {
  uint32_t bad = 0;
  for (int64_t i = begin; i < end; ++i) {
    bad |= math::non_finite_bit(a.x[i]);
    float added = a.x[i];
    if constexpr (kMomentum) {
      added = a.v[i] * a.m + a.x[i];
      a.sv[i] = added;
    }
    const float u = a.r[i] + added;
    a.w[i] = u;
    if constexpr (kCollect) {
      const uint32_t key = math::magnitude_key(u);
      if (key >= lowest) collector->take(key, i);
    }
  }
  return bad != 0;
}

// Above kStreamBytes u (and v') is written past the caches: the encoder reads back only
// the entries it sends.
template <bool kStream>
__attribute__((target("avx2"))) inline void store(float* at, __m256 v) {
  if constexpr (kStream) {
    _mm256_stream_ps(at, v);
  } else {
    _mm256_storeu_ps(at, v);
  }
}

template <bool kStream, bool kMomentum, bool kCollect>
__attribute__((target("avx2"))) bool pass_avx2(const Rows& a, int64_t begin, int64_t end, Collector* collector,
                                               uint32_t lowest) {
  int64_t i = begin;
  bool bad = false;
  if constexpr (kStream) {  // streaming stores take 32-byte aligned addresses (the spares share their alignment)
    i = std::min(end, begin + static_cast<int64_t>((32 - reinterpret_cast<uintptr_t>(a.w + begin) % 32) % 32) / 4);
    if constexpr (kMomentum) {
      if (reinterpret_cast<uintptr_t>(a.w) % 32 != reinterpret_cast<uintptr_t>(a.sv) % 32) {
        return pass_avx2<false, kMomentum, kCollect>(a, begin, end, collector, lowest);
      }
    }
    bad = pass_scalar<kMomentum, kCollect>(a, begin, i, collector, lowest);
  }
  const __m256 factor = _mm256_set1_ps(a.m);
  const __m256i exponent = _mm256_set1_epi32(0x7F800000);
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  // Keys are below 2^31, so a signed compare with lowest − 1 (−1 when lowest is 0) is key >= lowest.
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(lowest - 1u));
  __m256i bad_lanes = _mm256_setzero_si256();
  for (; i + 8 <= end; i += 8) {
    const __m256 xs = _mm256_loadu_ps(a.x + i);
    bad_lanes = _mm256_or_si256(bad_lanes,
                                _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(xs), exponent), exponent));
    __m256 added = xs;
    if constexpr (kMomentum) {
      added = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(a.v + i), factor), xs);
      store<kStream>(a.sv + i, added);
    }
    const __m256 u = _mm256_add_ps(_mm256_loadu_ps(a.r + i), added);
    store<kStream>(a.w + i, u);
    if constexpr (kCollect) {
      const __m256i key = _mm256_and_si256(_mm256_castps_si256(u), magnitude);
      auto hits = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, below))));
      if (hits) {
        alignas(32) uint32_t keys[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(keys), key);
        while (hits) {
          const int j = __builtin_ctz(hits);
          collector->take(keys[j], i + j);
          hits &= hits - 1;
        }
      }
    }
  }
  if constexpr (kStream) _mm_sfence();
  bad = bad || !_mm256_testz_si256(bad_lanes, bad_lanes);
  return pass_scalar<kMomentum, kCollect>(a, i, end, collector, lowest) || bad;
}

template <bool kMomentum, bool kCollect>
bool pass(const Rows& a, const Chunk& c, bool stream, Collector* collector, uint32_t lowest) {
  const int64_t end = c.begin + c.length;
  if (!kHasAvx2) return pass_scalar<kMomentum, kCollect>(a, c.begin, end, collector, lowest);
  return stream ? pass_avx2<true, kMomentum, kCollect>(a, c.begin, end, collector, lowest)
                : pass_avx2<false, kMomentum, kCollect>(a, c.begin, end, collector, lowest);
}

template <bool kCollect>
bool pass(const Rows& a, const Chunk& c, bool stream, Collector* collector, uint32_t lowest) {
  return a.v ? pass<true, kCollect>(a, c, stream, collector, lowest)
             : pass<false, kCollect>(a, c, stream, collector, lowest);
}

// The call's codec encoding the residual (ResidualSelection::encoding_residual). A piece
// is known by where its residual lies in the whole.
class ResidualEncodingSlotCodec final : public SlotCodec {
 public:
  ResidualEncodingSlotCodec(std::unique_ptr<SlotCodec> codec, const std::vector<ResidualSelection::Piece>& pieces,
                            const float* residual)
      : codec_(std::move(codec)), pieces_(pieces), residual_(residual) {}

  int64_t slot_bytes(int64_t n) const override { return codec_->slot_bytes(n); }
  std::unique_ptr<SlotCodec> part(int64_t begin, int64_t length) const override {
    return std::make_unique<ResidualEncodingSlotCodec>(codec_->part(begin, length), pieces_, residual_);
  }
  bool uniform() const override { return codec_->uniform(); }

  void encode(const at::Tensor&, const at::Tensor& residual, const EncodeContext& ctx,
              at::Tensor slot) const override {
    TORCH_INTERNAL_ASSERT(residual.defined() && residual.is_cpu(), "gradzip: encoding the residual takes one");
    const int64_t begin = residual.data_ptr<float>() - residual_;
    const auto piece = std::find_if(pieces_.begin(), pieces_.end(), [&](const ResidualSelection::Piece& p) {
      return p.chunk.begin == begin && p.chunk.length == residual.numel();
    });
    std::vector<int64_t> chosen;
    EncodeContext with = ctx;
    if (piece != pieces_.end() && piece->sampled && select_from_candidates(piece->candidates, piece->k, chosen)) {
      with.chosen = &chosen;
    }
    codec_->encode(residual, at::Tensor(), with, slot);
    codec_->decode_add(slot, slot.numel(), 1, residual, -1.0f);  // the sent entries only
  }
  void decode_sum(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    codec_->decode_sum(slots, stride, rows, std::move(sum), scale);
  }
  void decode_add(const at::Tensor& slots, int64_t stride, int rows, at::Tensor sum, float scale) const override {
    codec_->decode_add(slots, stride, rows, std::move(sum), scale);
  }
  void decode_each(const at::Tensor& slots, int64_t stride, const std::vector<at::Tensor>& targets,
                   float scale) const override {
    codec_->decode_each(slots, stride, targets, scale);
  }

 private:
  std::unique_ptr<SlotCodec> codec_;
  const std::vector<ResidualSelection::Piece>& pieces_;
  const float* residual_;
};

}  // namespace

ResidualSelection::ResidualSelection(CompressedState& state, const at::Tensor& x, double momentum,
                                     std::vector<EncodePiece> pieces, const std::string& key) {
  const int64_t n = x.numel();
  TORCH_INTERNAL_ASSERT(x.is_cpu() && x.is_contiguous() && x.scalar_type() == at::kFloat);
  const auto spare_of = [&](at::Tensor& spare) {
    if (!spare.defined() || spare.numel() != n) spare = at::empty({n}, x.options());
    return spare.data_ptr<float>();
  };
  at::Tensor& residual = residual_on(state, x.device(), n, key);
  if (!residual.is_contiguous()) residual = residual.contiguous();  // as loaded
  Rows rows{residual.data_ptr<float>(), x.data_ptr<float>(), spare_of(state.spare_residual), nullptr, nullptr,
            static_cast<float>(momentum)};
  if (momentum > 0) {
    velocity_for(state, x, key);
    if (!state.velocity.is_contiguous()) state.velocity = state.velocity.contiguous();  // as loaded
    rows.v = state.velocity.data_ptr<float>();
    rows.sv = spare_of(state.spare_velocity);
  }
  const bool stream = n * 4 >= kStreamBytes;
  bool bad = false;
  for (const EncodePiece& encode : pieces) {
    const Chunk& chunk = encode.chunk;
    Piece piece{chunk, encode.density > 0 ? count_for_density(encode.density, chunk.length) : 0, false, {}};
    // The sample reads u as the pass will make it, rounded the same way.
    std::optional<uint32_t> lowest;
    if (encode.density > 0) {
      lowest = sampled_threshold_of(chunk.length, piece.k, [&](int64_t i) {
        const int64_t j = chunk.begin + i;
        const float added = rows.v ? rows.v[j] * rows.m + rows.x[j] : rows.x[j];
        return math::magnitude_key(rows.r[j] + added);
      });
    }
    if (lowest) {
      piece.sampled = true;
      const auto cap = static_cast<size_t>(candidate_cap(piece.k));
      piece.candidates.reserve(std::min<size_t>(cap, static_cast<size_t>(2 * piece.k + 1024)));
      Collector collector{piece.candidates, cap, chunk.begin};
      bad = pass<true>(rows, chunk, stream, &collector, *lowest) || bad;
    } else {
      bad = pass<false>(rows, chunk, stream, nullptr, 0) || bad;
    }
    pieces_.push_back(std::move(piece));
  }
  finite_ = !bad;
}

std::vector<ResidualSelection::EncodePiece> ResidualSelection::oneshot_pieces(const Codec& codec,
                                                                             const std::vector<CodecPiece>& layers,
                                                                             int64_t n, int ranks,
                                                                             int64_t rounds_requested) {
  const auto density = [](const Codec& of) {
    const SelectionParameters* exact = exact_selection(of);
    return exact ? exact->density : 0.0;
  };
  const int rounds = oneshot_rounds(codec, n, ranks, rounds_requested);
  std::vector<EncodePiece> pieces;
  for (int s = 0; s < rounds; ++s) {
    const Chunk round = exchange_chunk(n, rounds, s);
    if (layers.empty()) {
      pieces.push_back({round, density(codec)});
      continue;
    }
    int64_t offset = 0;  // a piecewise codec's part() cuts the round at its pieces
    for (const CodecPiece& layer : layers) {
      const int64_t from = std::max(round.begin, offset);
      const int64_t to = std::min(round.begin + round.length, offset + layer.numel);
      if (from < to) pieces.push_back({{from, to - from}, density(*layer.codec)});
      offset += layer.numel;
    }
  }
  return pieces;
}

void ResidualSelection::take(CompressedState& state) {
  std::swap(state.residual, state.spare_residual);
  residual_ = state.residual.data_ptr<float>();
}

std::unique_ptr<SlotCodec> ResidualSelection::encoding_residual(std::unique_ptr<SlotCodec> codec) const {
  TORCH_INTERNAL_ASSERT(residual_, "gradzip: a residual selection encodes after take()");
  return std::make_unique<ResidualEncodingSlotCodec>(std::move(codec), pieces_, residual_);
}

}  // namespace gradzip
