// The codec registry: one line per built-in codec. A new codec is its own file pair and
// one line here (plus its .cu for a device half); register_codec() adds others.
#include <algorithm>

#include "codec/cast_codecs.h"
#include "codec/polar_codec.h"
#include "codec/qsgd_codec.h"
#include "codec/randomk_codec.h"
#include "codec/sign_codec.h"
#include "codec/stc_codec.h"
#include "codec/sz_codec.h"
#include "codec/topk_codec.h"
#include "codec/system_libraries.h"
#include "codec/uniform_codec.h"
#if GRADZIP_WITH_ZFP
#include "codec/zfp_codec.h"
#endif

namespace gradzip {
namespace {

// Built-in codecs whose library this build lacks: still known by name and id, so that a
// spec or a payload naming one says what is missing.
struct AbsentCodec {
  const char* name;
  CodecId id;
  SystemLibrary library;
};
const std::vector<AbsentCodec>& absent_codecs() {
  static const std::vector<AbsentCodec> absent = {
#if !GRADZIP_WITH_ZFP
      {"zfp", CodecId::kZfp, SystemLibrary::kZfp},
#endif
  };
  return absent;
}

std::string names() {
  std::string out;
  for (const auto* record : codec_records()) out += (out.empty() ? "" : ", ") + record->name;
  return out;
}

}  // namespace

std::unique_ptr<Codec> CodecRecord::build(const Spec& spec) const {
  Spec with_defaults = spec;
  fill_defaults(with_defaults, keys);
  return make(with_defaults);
}

namespace {

std::vector<const CodecRecord*>& registry() {
  static std::vector<const CodecRecord*> records = {
      &identity_record(), &fp16_record(), &bf16_record(), &topk_record(),
      &randomk_record(),  &stc_record(),  &sign_record(), &qsgd_record(),  &uniform_record(), &sz_record(),
#if GRADZIP_WITH_ZFP
      &zfp_record(),
#endif
      &polar_record(),
  };
  return records;
}

}  // namespace

const std::vector<const CodecRecord*>& codec_records() { return registry(); }

void register_codec(const CodecRecord& record) {
  for (const auto* known : registry()) {
    if (known->name == record.name || known->id == record.id) {
      throw std::invalid_argument("gradzip: codec '" + record.name + "' (id " + std::to_string(static_cast<int>(record.id)) +
                                  ") has the name or the id of codec '" + known->name + "' (id " +
                                  std::to_string(static_cast<int>(known->id)) + ")");
    }
  }
  registry().push_back(&record);
}

const CodecRecord* find_codec_record(const std::string& name) {
  for (const auto* record : codec_records()) {
    if (record->name == name) return record;
  }
  return nullptr;
}

const CodecRecord* find_codec_record(uint8_t id) {
  for (const auto* record : codec_records()) {
    if (static_cast<uint8_t>(record->id) == id) return record;
  }
  return nullptr;
}

void refuse_absent_codec(const std::string& name) {
  for (const auto& absent : absent_codecs()) {
    if (name == absent.name) throw SpecError(missing_library_message("codec '" + name + "'", absent.library));
  }
}

void refuse_absent_codec(uint8_t id) {
  for (const auto& absent : absent_codecs()) {
    if (static_cast<uint8_t>(absent.id) == id) {
      throw PayloadError(missing_library_message("a payload of codec '" + std::string(absent.name) + "'", absent.library));
    }
  }
}

const CodecRecord& codec_record(CodecId id) {
  const CodecRecord* record = find_codec_record(static_cast<uint8_t>(id));
  if (!record) throw std::logic_error("gradzip: no codec has id " + std::to_string(static_cast<int>(id)));
  return *record;
}

std::unique_ptr<Codec> make_codec(const Spec& spec) {
  const CodecRecord* record = find_codec_record(spec.name);
  if (!record) {
    refuse_absent_codec(spec.name);
    throw SpecError("gradzip: unknown codec '" + spec.name + "' in spec '" + spec.str() + "'; valid codecs: " + names());
  }
  check_keys(spec, record->keys, "codec '" + record->name + "'");
  return record->build(spec);
}

std::unique_ptr<Codec> codec_for_payload(const uint8_t* data, size_t size) {
  // Decoders read every parameter from the payload: the default instance serves.
  const CodecRecord& record = codec_record(read_payload_header(data, size).codec);
  return record.make_decoder ? record.make_decoder() : record.build(Spec{record.name, {}, {}});
}

}  // namespace gradzip
