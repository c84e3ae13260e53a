// Codec: a compressor of float tensors into self-describing bytes, and back.
//
// Codecs work on plain memory: no torch, no communication, usable by anything that
// moves bytes (a federated server, a file). encode() turns n floats into a payload
// (docs/wire-format.md: a 16-byte header with magic, version, codec id and element
// count, then the codec's sections). decode_add() checks every length, count and
// index of a payload before it writes anything outside what it was given, and throws
// PayloadError naming the problem for a truncated, corrupt or hostile payload.
//
// Error feedback: given a residual e, encode() compresses u = x + e and leaves
// e = fl(u − sent), where sent is exactly what decode_add() of the payload yields.
// All codecs are deterministic: the same input, residual and context give the same
// bytes on every machine.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gradzip/spec.h"

namespace gradzip {

class PayloadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What makes a codec's random choices reproducible: random-k and QSGD draw their
// numbers from (seed, step, rank, element) with a counter-based generator. And where a
// codec that selects reports what it chose.
struct EncodeContext {
  uint64_t seed = 0;
  uint64_t step = 0;  // advanced by the caller after each encode of the same tensor
  uint32_t rank = 0;  // random-k ignores it: all ranks pick the same elements
  // Non-null: a codec that selects (Codec::selects) appends the positions its payload
  // carries, each plus `sent_offset`, ascending; other codecs append nothing. What the
  // aggregation's momentum correction zeroes the velocity at, with no pass over the
  // elements that were not sent.
  std::vector<int64_t>* sent = nullptr;
  int64_t sent_offset = 0;
  // Non-null: the positions an exact selection codec (top-k, STC without approx) sends,
  // found by the caller as the codec finds them (the k = ceil(density·n) largest
  // magnitudes of x + residual, ties to the lower positions), ascending; the codec then
  // writes them without reading its input to select (std::invalid_argument when they are
  // not k ascending positions below n). Other codecs ignore it.
  const std::vector<int64_t>* chosen = nullptr;
};

// Appends `chosen` (ascending positions in the encoded elements) to ctx.sent, if asked.
void report_sent(const EncodeContext& ctx, const std::vector<int64_t>& chosen);

// The seed of the tensor named `key` under a spec's `seed`: a stable hash of the key
// (FNV-1a) mixed into the seed (SplitMix64), so tensors of one step draw independent
// numbers (random-k's positions, QSGD's and uniform's rounding), the same on every rank
// and in every run.
uint64_t seed_for_key(uint64_t seed, std::string_view key);

enum class CodecId : uint8_t {
  kIdentity = 1,
  kFp16 = 2,
  kBf16 = 3,
  kTopK = 4,
  kRandomK = 5,
  kStc = 6,
  kSign = 7,
  kQsgd = 8,
  kSz = 9,
  kZfp = 10,
  kPolar = 11,
  kUniform = 12,
};

// The knob that sets a codec's size, which an aggregation may turn (per-layer budgets,
// density warm-up): the share of elements sent (top-k, random-k, STC) or the number of
// quantization levels (QSGD). Other codecs have none.
enum class BudgetKind : uint8_t { kNone, kDensity, kLevels };
inline constexpr int kMaxBudgetLevels = 32767;
struct Budget {
  BudgetKind kind = BudgetKind::kNone;
  double value = 0.0;  // a density in (0, 1], or whole levels in [1, kMaxBudgetLevels]
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual CodecId id() const = 0;
  virtual std::string name() const = 0;
  // The codec's size knob (kind kNone: none).
  virtual Budget budget() const { return {}; }
  // The same codec with its knob at `value` (of budget()'s kind, within its range).
  // Throws std::invalid_argument for a codec without a knob or a value out of range.
  virtual std::unique_ptr<Codec> with_budget(double value) const;
  // True when the sum of payloads is a vote, whose sign is the result (sign with
  // vote=majority): the aggregation takes the sign of the sum rather than averaging it.
  virtual bool votes() const { return false; }
  // True when a codec without a budget is best given each parameter alone by default
  // (layers=auto): sign, whose block scales then stay within a parameter.
  virtual bool per_parameter_by_default() const { return false; }
  // True when the codec is biased and error feedback is on by default (top-k, STC, sign).
  virtual bool biased() const = 0;
  // True when an Inf or NaN in x always makes some decoded value non-finite (false for
  // majority-vote sign, which sends a NaN's sign bit, and random-k, which may not pick it).
  virtual bool carries_non_finite() const { return true; }
  // True when a payload keeps a subset of the elements (top-k, random-k, STC): a sum
  // selected again (two-phase's owners) drops what the second selection leaves out.
  virtual bool selects() const { return false; }
  // True when encoding a sum of decoded payloads again loses next to nothing (the casts:
  // identity, fp16, bf16). Two-phase's owners re-encode each chunk's sum: for any other
  // codec that is a second compression error on top of the first.
  virtual bool reencodes_losslessly() const { return false; }

  // Appends the payload of x[0..n) to `out`. With a non-null `residual` (n floats),
  // compresses x + residual and leaves in `residual` what was not sent. The error-bounded
  // codecs (sz, zfp) and uniform throw std::invalid_argument for Inf or NaN in x + residual
  // (encode_unless_non_finite() keeps non-finite x from them; x + residual can still overflow).
  virtual void encode(const float* x, int64_t n, float* residual, const EncodeContext& ctx,
                      std::vector<uint8_t>& out) const = 0;

  // Writes the payload encode() would append into out[0..capacity) and returns its size;
  // capacity must be at least max_payload_bytes(n). What an exchange calls to fill its
  // slots: the codecs whose layout is fixed write in place, the others encode into a
  // buffer kept per thread and copy.
  virtual size_t encode_into(const float* x, int64_t n, float* residual, const EncodeContext& ctx, uint8_t* out,
                             size_t capacity) const;

  // Adds scale × the payload's values to out[0..n). Throws PayloadError when the
  // payload is not a valid payload of this codec for n elements.
  virtual void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale = 1.0f) const = 0;

  // The largest payload encode() can write for n elements (header included): what an
  // exchange reserves per payload so that no rank has to send its size first.
  virtual size_t max_payload_bytes(int64_t n) const = 0;

  // The squared error ‖x − decode(encode(x))‖² (float64, without error feedback) of this
  // codec with its knob at each of `budgets` (values with_budget() takes), from one look
  // at x: what a per-layer budget compares. Empty when the codec has no such shortcut,
  // and the caller encodes and decodes at each budget. Top-k (fp32 values) and STC with
  // an exact selection compute it from x's magnitudes, equal to the encode-decode's up to
  // float64 rounding; an x that is not all finite gets none.
  virtual std::vector<double> errors_at_budgets(const float* x, int64_t n, const std::vector<double>& budgets) const {
    return {};
  }
};

// The payload header, as decoded by read_payload_header().
struct PayloadHeader {
  CodecId codec;
  uint8_t version;
  uint64_t numel;
  bool non_finite;  // header flag bit 0: see encode_unless_non_finite()
};
constexpr size_t kPayloadHeaderBytes = 16;
constexpr uint8_t kWireVersion = 1;

constexpr uint32_t kNonFinitePayloadFlag = 1;
// Reads and checks the header: magic, version, a known codec id, known flags (a
// non-finite payload is the header alone). Throws PayloadError.
PayloadHeader read_payload_header(const uint8_t* data, size_t size);

// Non-finite input. Error feedback must not absorb a step whose input holds Inf or NaN
// (mixed precision skips such steps on purpose): the residual would stay non-finite
// forever. True when every x[i] is finite (one pass, at memory speed).
bool all_finite(const float* x, int64_t n);
// Encodes like codec.encode() when x is all finite and returns true. Otherwise appends
// a non-finite payload (the codec's header with flag bit 0 set, no body), leaves the
// residual as it was and returns false.
bool encode_unless_non_finite(const Codec& codec, const float* x, int64_t n, float* residual,
                              const EncodeContext& ctx, std::vector<uint8_t>& out);
// encode_unless_non_finite() into out[0..capacity) (at least codec.max_payload_bytes(n)):
// returns the payload's size and sets `finite` to what encode_unless_non_finite() returns.
size_t encode_into_unless_non_finite(const Codec& codec, const float* x, int64_t n, float* residual,
                                     const EncodeContext& ctx, uint8_t* out, size_t capacity, bool& finite);
// Adds scale × any payload's values to out[0..n) (Codec::decode_add): its codec from the
// header; a non-finite payload makes every element NaN. Throws PayloadError.
// (Codec::decode_add() refuses non-finite payloads: aggregations agree on finiteness
// before they encode.)
void decode_payload_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale = 1.0f);

// The codec a spec names, e.g. "topk:density=0.01": its name, its own keys only (an
// aggregation's keys are split off by gradzip/bound_spec.h), values checked. Throws
// SpecError listing the valid codecs, or the codec's valid keys.
std::unique_ptr<Codec> make_codec(const Spec& spec);

// The codec that wrote a payload, with the parameters its decoder needs from the header.
std::unique_ptr<Codec> codec_for_payload(const uint8_t* data, size_t size);

}  // namespace gradzip
