#include "codec/wire.h"

#include "codec/codec_record.h"

namespace gradzip {
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
  if (!find_codec_record(id)) {
    refuse_absent_codec(id);
    r.fail("unknown codec id " + std::to_string(id));
  }
  h.codec = static_cast<CodecId>(id);
  const uint32_t flags = r.get<uint32_t>("flags");
  if ((flags & ~kNonFinitePayloadFlag) != 0) r.fail("unknown header flags " + std::to_string(flags));
  h.non_finite = (flags & kNonFinitePayloadFlag) != 0;
  h.numel = r.get<uint64_t>("element count");
  if (h.non_finite && size > kPayloadHeaderBytes) {
    r.fail("a non-finite payload is its header alone; " + std::to_string(size - kPayloadHeaderBytes) +
           " bytes follow it");
  }
  return h;
}

namespace wire {

void Reader::header(CodecId codec, int64_t n) {
  if (have_ < kPayloadHeaderBytes && size_ >= kPayloadHeaderBytes) {
    throw std::logic_error("gradzip: the payload header lies beyond the bytes read");
  }
  const PayloadHeader h = read_payload_header(data_, have_);
  if (h.codec != codec) {
    fail("a " + codec_record(h.codec).name + " payload given to the " + codec_ + " decoder");
  }
  if (h.numel != static_cast<uint64_t>(n)) {
    fail("the payload holds " + std::to_string(h.numel) + " elements, the output has " + std::to_string(n));
  }
  if (h.non_finite) {
    fail("a non-finite payload (its sender's input held Inf or NaN) reached the codec's decoder; "
         "decode_payload_add() decodes it");
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
