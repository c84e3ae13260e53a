// CodecRecord: everything about one codec in one place — its id and name, its spec keys
// with defaults and valid values, how a spec becomes its parameters, its host codec, and
// its device half (CUDA kernels) when it has one. Each codec defines its record in its
// own file pair; codec_registry.cpp lists them. Nothing outside the records switches
// over codec ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradzip/codec.h"

namespace gradzip {

// How a codec sends values: its wire byte (docs/wire-format.md).
enum class ValueType : uint8_t { kFp32 = 0, kFp16 = 1, kBf16 = 2 };

// A codec's parameters: each codec has a type of its own (SignParameters, ...), declared
// in its header beside the accessor its device half reads them through
// (sign_parameters(codec), ...). A codec holds them through WithParameters.
template <class Parameters>
class WithParameters {
 public:
  explicit WithParameters(const Parameters& parameters) : parameters_(parameters) {}
  const Parameters& parameters() const { return parameters_; }

 protected:
  Parameters parameters_;
};

// The parameters of `codec`, which must hold Parameters (std::logic_error otherwise: a
// device half given another codec's instance).
template <class Parameters>
const Parameters& parameters_of(const Codec& codec) {
  const auto* typed = dynamic_cast<const WithParameters<Parameters>*>(&codec);
  if (typed == nullptr) throw std::logic_error("gradzip: codec '" + codec.name() + "' holds other parameters");
  return typed->parameters();
}

// A codec's CUDA half (codec/device_half.h), defined in its .cu file.
struct DeviceHalf;

struct CodecRecord {
  CodecId id;
  std::string name;
  std::string summary;
  std::vector<SpecKey> keys;
  // The codec of a spec whose keys were checked one by one (check_keys), with the
  // defaults of `keys` filled in (call it through build()): parses the codec's own
  // parameters (the rules that tie keys together, the defaults that depend on other
  // keys) and builds it. Reads only the codec's own keys (the spec may hold an
  // aggregation's too). Throws SpecError.
  std::unique_ptr<Codec> (*make)(const Spec& spec);
  const DeviceHalf* device;  // null: no kernels; CUDA tensors go through the host codec
  // The decoder of any payload of this codec, for codec_for_payload (gradzip.codec.decode
  // has no spec): one that takes the shape a payload states (polar's block and rate)
  // rather than refusing one that differs from its parameters. An aggregation's codec
  // refuses another shape, so a peer cannot make it design codes it does not use. Null:
  // the codec of the defaults decodes every payload.
  std::unique_ptr<Codec> (*make_decoder)() = nullptr;

  // make() of `spec` with the defaults of `keys` for the keys it leaves out.
  std::unique_ptr<Codec> build(const Spec& spec) const;
};

// Every codec, in the order error messages and docs list them.
const std::vector<const CodecRecord*>& codec_records();
// The record of a name or a wire id; null when there is none.
const CodecRecord* find_codec_record(const std::string& name);
const CodecRecord* find_codec_record(uint8_t id);
// A built-in codec whose system library this build lacks (codec/system_libraries.h) has no
// record; these throw, naming the library, when `name` (SpecError) or `id` (PayloadError)
// is one, and return otherwise.
void refuse_absent_codec(const std::string& name);
void refuse_absent_codec(uint8_t id);
// The record of a codec id that exists (an id from a record or a checked header).
const CodecRecord& codec_record(CodecId id);
// Adds a codec to the registry: every door (make_codec, the aggregations' spec binding,
// codec_for_payload, gradzip.codecs()) finds it from then on. The record must outlive
// every use; its name and id must be new (std::invalid_argument otherwise). For codecs
// defined outside csrc/codec (a test's); the built-in ones are listed in
// codec_registry.cpp.
void register_codec(const CodecRecord& record);

// A device half, named by its symbol, in builds with CUDA; null in CPU-only builds.
#ifdef GRADZIP_WITH_CUDA
#define GRADZIP_DEVICE_HALF(half) (&(half))
#else
#define GRADZIP_DEVICE_HALF(half) nullptr
#endif

// k = ceil(density × n), clamped to [0, n].
int64_t count_for_density(double density, int64_t n);


}  // namespace gradzip
