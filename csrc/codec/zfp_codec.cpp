#include "codec/zfp_codec.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "codec/codec_base.h"
#include "codec/error_bound.h"
#include "codec/wire.h"
#include "codec/zfp_prediction.h"
#include "codec/zfp_stream.h"

namespace gradzip {
namespace {

constexpr uint8_t kZfpFormat = 0, kRaw = 1;
constexpr size_t kCorrectionBytes = 12;

struct ZfpLayout {
  uint8_t format;
  uint8_t mode = kZfpAccuracy;
  double tolerance = 0.0;
  uint64_t corrections = 0;
  wire::Section stream, correction_entries, raw;
};

ZfpLayout read_zfp_layout(wire::Reader& r, int64_t n) {
  r.header(CodecId::kZfp, n);
  ZfpLayout layout;
  layout.format = r.get<uint8_t>("format");
  if (layout.format == kRaw) {
    layout.raw = r.take(static_cast<uint64_t>(n) * 4, "raw values");
  } else if (layout.format == kZfpFormat) {
    layout.mode = r.get<uint8_t>("zfp mode");
    if (layout.mode != kZfpAccuracy && layout.mode != kZfpReversible) r.fail("unknown zfp mode " + std::to_string(layout.mode));
    layout.tolerance = r.get<double>("tolerance");
    if (layout.mode == kZfpAccuracy && !(layout.tolerance > 0.0 && std::isfinite(layout.tolerance))) {
      r.fail("the tolerance is not a finite number above 0");
    }
    const uint64_t stream_bytes = r.get<uint64_t>("stream bytes");
    layout.corrections = r.get_count("correction count", n);
    layout.stream = r.take(stream_bytes, "zfp stream");
    layout.correction_entries = r.take(layout.corrections * kCorrectionBytes, "corrections");
  } else {
    r.fail("unknown format " + std::to_string(layout.format));
  }
  r.finish();
  return layout;
}

class ZfpCodec final : public ValueCodec, public WithParameters<ErrorBoundParameters> {
 public:
  explicit ZfpCodec(const ErrorBoundParameters& p) : ValueCodec(CodecId::kZfp), WithParameters(p) {}
  bool biased() const override { return false; }
  size_t max_payload_bytes(int64_t n) const override { return kPayloadHeaderBytes + 1 + static_cast<size_t>(n) * 4; }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "zfp");
    const ZfpLayout layout = read_zfp_layout(r, n);
    std::vector<float> values(static_cast<size_t>(n));
    if (layout.format == kRaw) {
      if (n > 0) std::memcpy(values.data(), r.at(layout.raw), n * 4);
    } else {
      ZfpStream stream(values.data(), n, layout.mode, layout.tolerance);
      const size_t capacity = std::max<size_t>(stream.maximum_bytes(), layout.stream.bytes) + 8;
      if (layout.stream.bytes > stream.maximum_bytes()) {
        r.fail("a ZFP stream of " + std::to_string(layout.stream.bytes) + " bytes, more than ZFP writes for " +
               std::to_string(n) + " elements");
      }
      std::vector<uint8_t> padded(capacity, 0);
      if (layout.stream.bytes) std::memcpy(padded.data(), r.at(layout.stream), layout.stream.bytes);
      if (n > 0) {
        const size_t read = stream.decompress(padded.data(), capacity);
        if (read == 0 || read > layout.stream.bytes) r.fail("the ZFP stream does not decode within its bytes");
      }
      const uint8_t* entries = r.at(layout.correction_entries);
      uint64_t last = 0;
      for (uint64_t c = 0; c < layout.corrections; ++c) {
        uint64_t index;
        float value;
        std::memcpy(&index, entries + kCorrectionBytes * c, 8);
        std::memcpy(&value, entries + kCorrectionBytes * c + 8, 4);
        if (index >= static_cast<uint64_t>(n) || (c > 0 && index <= last)) {
          r.fail("correction " + std::to_string(c) + " has index " + std::to_string(index) +
                 " (indices must ascend and stay below " + std::to_string(n) + ")");
        }
        values[index] = value;
        last = index;
      }
    }
    for (int64_t i = 0; i < n; ++i) out[i] += scale * values[i];
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const override {
    const double eb = absolute_bound(parameters_, u, n, "zfp");
    wire::Writer w(out);
    w.header(id(), n);
    const size_t raw_bytes = static_cast<size_t>(n) * 4;
    if (n == 0) {
      w.put<uint8_t>(kRaw);
      return;
    }
    const uint8_t mode = eb > 0.0 ? kZfpAccuracy : kZfpReversible;
    ZfpStream encoder(const_cast<float*>(u), n, mode, eb);  // zfp_compress only reads the field
    const size_t capacity = encoder.maximum_bytes();
    const auto stream = std::make_unique_for_overwrite<uint8_t[]>(capacity);
    const size_t stream_bytes = encoder.compress(stream.get(), capacity);
    if (stream_bytes == 0) throw std::runtime_error("gradzip: zfp failed to compress " + std::to_string(n) + " elements");
    // The elements the receiver will decode outside the bound: predicted where the
    // prediction is exact for this libzfp (zfp_prediction.h), else found by decoding.
    std::vector<uint64_t> corrections;
    const bool predicted = mode == kZfpAccuracy && zfp_prediction_matches_library() &&
                           zfp_values_outside_bound(u, n, eb, corrections);
    if (!predicted) {
      corrections.clear();
      const auto decoded = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(n));
      ZfpStream decoder(decoded.get(), n, mode, eb);
      if (decoder.decompress(stream.get(), capacity) == 0) {
        throw std::runtime_error("gradzip: zfp failed to decode its own stream");
      }
      for (int64_t i = 0; i < n; ++i) {
        if (!within_bound(decoded[i], u[i], eb)) corrections.push_back(static_cast<uint64_t>(i));
      }
    }
    if (1 + 1 + 8 + 8 + 8 + stream_bytes + corrections.size() * kCorrectionBytes >= raw_bytes + 1) {
      w.put<uint8_t>(kRaw);
      w.put_floats(u, n);
      return;
    }
    w.put<uint8_t>(kZfpFormat);
    w.put<uint8_t>(mode);
    w.put<double>(eb);
    w.put<uint64_t>(stream_bytes);
    w.put<uint64_t>(corrections.size());
    std::memcpy(w.reserve(stream_bytes), stream.get(), stream_bytes);
    for (uint64_t index : corrections) {
      w.put<uint64_t>(index);
      w.put<float>(u[index]);
    }
  }
};

}  // namespace

const CodecRecord& zfp_record() {
  static const CodecRecord record = {
      CodecId::kZfp,
      "zfp",
      "ZFP fixed-accuracy compression (libzfp) with every element checked against the error bound",
      error_bound_keys(),
      [](const Spec& spec) -> std::unique_ptr<Codec> { return std::make_unique<ZfpCodec>(parse_error_bound(spec)); },
      nullptr,
  };
  return record;
}

}  // namespace gradzip
