#include "codec/wire.h"

namespace gradzip {
namespace {

const char* codec_name(uint8_t id) {
  switch (static_cast<CodecId>(id)) {
    case CodecId::kIdentity: return "identity";
    case CodecId::kFp16: return "fp16";
    case CodecId::kBf16: return "bf16";
    case CodecId::kTopK: return "topk";
    case CodecId::kRandomK: return "randomk";
    case CodecId::kStc: return "stc";
    case CodecId::kSign: return "sign";
    case CodecId::kQsgd: return "qsgd";
  }
  return nullptr;
}

}  // namespace

PayloadHeader read_payload_header(const uint8_t* data, size_t size) {
  wire::Reader r(data, size, "payload");
  if (r.get<uint16_t>("magic") != 0x5A47) r.fail("not a gradzip payload (bad magic)");
  PayloadHeader h;
  h.version = r.get<uint8_t>("version");
  if (h.version != kWireVersion) {
    r.fail("wire format version " + std::to_string(h.version) + ", this build reads version " +
           std::to_string(kWireVersion));
  }
  const uint8_t id = r.get<uint8_t>("codec id");
  if (!codec_name(id)) r.fail("unknown codec id " + std::to_string(id));
  h.codec = static_cast<CodecId>(id);
  if (r.get<uint32_t>("reserved") != 0) r.fail("reserved header bytes are not zero");
  h.numel = r.get<uint64_t>("element count");
  return h;
}

namespace wire {

void Reader::header(CodecId codec, int64_t n) {
  const PayloadHeader h = read_payload_header(data_, size_);
  if (h.codec != codec) {
    fail(std::string("a ") + codec_name(static_cast<uint8_t>(h.codec)) + " payload given to the " + codec_ +
         " decoder");
  }
  if (h.numel != static_cast<uint64_t>(n)) {
    fail("the payload holds " + std::to_string(h.numel) + " elements, the output has " + std::to_string(n));
  }
  at_ = kPayloadHeaderBytes;
}

void Reader::finish() const {
  if (at_ != size_) fail(std::to_string(size_ - at_) + " bytes left over after the last section");
}

void Reader::fail(const std::string& why) const {
  throw PayloadError(std::string("gradzip: invalid ") + codec_ + " payload: " + why);
}

}  // namespace wire
}  // namespace gradzip
