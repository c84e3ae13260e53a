#include "codec/lossless.h"

#if GRADZIP_WITH_BLOSC
#include <blosc.h>
#endif
#if GRADZIP_WITH_ZSTD
#include <zstd.h>
#endif

#include "gradzip/codec.h"
#include "gradzip/spec.h"
#include "codec/system_libraries.h"

namespace gradzip::lossless {
namespace {

// The library behind a method; kNone has none.
SystemLibrary library_of(Method method) { return method == Method::kZstd ? SystemLibrary::kZstd : SystemLibrary::kBlosc; }

bool built(Method method) { return method == Method::kNone || built_with(library_of(method)); }

[[noreturn]] void corrupt(Method method, const std::string& why) {
  throw PayloadError("gradzip: invalid " + method_name(method) + " stream: " + why);
}

#if GRADZIP_WITH_BLOSC
constexpr int kBloscLevel = 5;

// blosc's global context is not thread-safe; its _ctx calls are, and use one thread here.
std::vector<uint8_t> blosc_compress(const uint8_t* data, size_t size) {
  if (size > static_cast<size_t>(BLOSC_MAX_BUFFERSIZE)) {
    throw std::invalid_argument("gradzip: blosc compresses at most " + std::to_string(BLOSC_MAX_BUFFERSIZE) +
                                " bytes at once, got " + std::to_string(size));
  }
  std::vector<uint8_t> out(size + BLOSC_MAX_OVERHEAD);
  const int written = blosc_compress_ctx(kBloscLevel, BLOSC_SHUFFLE, 4, size, data, out.data(), out.size(),
                                         BLOSC_BLOSCLZ_COMPNAME, 0, 1);
  if (written <= 0) throw std::runtime_error("gradzip: blosc failed to compress " + std::to_string(size) + " bytes");
  out.resize(static_cast<size_t>(written));
  return out;
}

std::vector<uint8_t> blosc_decompress(const uint8_t* data, size_t size, size_t raw_size) {
  size_t nbytes = 0, cbytes = 0;
  if (size < BLOSC_MIN_HEADER_LENGTH || blosc_cbuffer_validate(data, size, &nbytes) != 0) {
    corrupt(Method::kBlosc, "its header is not valid for " + std::to_string(size) + " bytes");
  }
  size_t blocksize = 0;
  blosc_cbuffer_sizes(data, &nbytes, &cbytes, &blocksize);
  if (nbytes != raw_size) {
    corrupt(Method::kBlosc, "it holds " + std::to_string(nbytes) + " bytes, " + std::to_string(raw_size) + " expected");
  }
  if (cbytes != size) {
    corrupt(Method::kBlosc, "it says " + std::to_string(cbytes) + " compressed bytes, " + std::to_string(size) + " given");
  }
  std::vector<uint8_t> out(raw_size);
  if (raw_size == 0) return out;
  const int got = blosc_decompress_ctx(data, out.data(), out.size(), 1);
  if (got < 0 || static_cast<size_t>(got) != raw_size) corrupt(Method::kBlosc, "its blocks do not decode");
  return out;
}
#endif

#if GRADZIP_WITH_ZSTD
constexpr int kZstdLevel = 1;  // its fastest standard level: the codecs before it did the heavy work

std::vector<uint8_t> zstd_compress(const uint8_t* data, size_t size) {
  std::vector<uint8_t> out(ZSTD_compressBound(size));
  const size_t written = ZSTD_compress(out.data(), out.size(), data, size, kZstdLevel);
  if (ZSTD_isError(written)) throw std::runtime_error(std::string("gradzip: zstd: ") + ZSTD_getErrorName(written));
  out.resize(written);
  return out;
}

std::vector<uint8_t> zstd_decompress(const uint8_t* data, size_t size, size_t raw_size) {
  const unsigned long long declared = ZSTD_getFrameContentSize(data, size);
  if (declared == ZSTD_CONTENTSIZE_ERROR) corrupt(Method::kZstd, "not a zstd frame");
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != raw_size) {
    corrupt(Method::kZstd, "it holds " + std::to_string(declared) + " bytes, " + std::to_string(raw_size) + " expected");
  }
  std::vector<uint8_t> out(raw_size);
  const size_t got = ZSTD_decompress(out.data(), out.size(), data, size);
  if (ZSTD_isError(got)) corrupt(Method::kZstd, ZSTD_getErrorName(got));
  if (got != raw_size) {
    corrupt(Method::kZstd, "it decodes to " + std::to_string(got) + " bytes, " + std::to_string(raw_size) + " expected");
  }
  return out;
}
#endif

}  // namespace

std::vector<std::string> method_names() {
  return {method_name(Method::kNone), method_name(Method::kZstd), method_name(Method::kBlosc)};
}

Method method_from_name(const std::string& name) {
  const auto names = method_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != name) continue;
    const auto method = static_cast<Method>(i);
    if (!built(method)) throw SpecError(missing_library_message("lossless=" + name, library_of(method)));
    return method;
  }
  throw SpecError("gradzip: unknown lossless stage '" + name + "'; valid: none, zstd, blosc");
}

std::string method_name(Method method) {
  switch (method) {
    case Method::kNone: return "none";
    case Method::kZstd: return "zstd";
    case Method::kBlosc: return "blosc";
  }
  return "unknown";
}

Method method_from_byte(uint8_t byte) {
  if (byte > static_cast<uint8_t>(Method::kBlosc)) {
    throw PayloadError("gradzip: unknown lossless stage " + std::to_string(byte) + " (valid: 0 none, 1 zstd, 2 blosc)");
  }
  const auto method = static_cast<Method>(byte);
  if (!built(method)) {
    throw PayloadError(missing_library_message("a payload whose lossless stage is " + method_name(method),
                                               library_of(method)));
  }
  return method;
}

std::string preferred_method() { return built(Method::kZstd) ? "zstd" : "none"; }

std::vector<uint8_t> compress(Method method, const uint8_t* data, size_t size) {
  switch (method) {
    case Method::kNone: return std::vector<uint8_t>(data, data + size);
#if GRADZIP_WITH_ZSTD
    case Method::kZstd: return zstd_compress(data, size);
#endif
#if GRADZIP_WITH_BLOSC
    case Method::kBlosc: return blosc_compress(data, size);
#endif
    default: throw std::invalid_argument(missing_library_message("lossless=" + method_name(method), library_of(method)));
  }
}

std::vector<uint8_t> decompress(Method method, const uint8_t* data, size_t size, size_t raw_size) {
  switch (method) {
    case Method::kNone:
      if (size != raw_size) {
        corrupt(method, std::to_string(size) + " bytes stored, " + std::to_string(raw_size) + " expected");
      }
      return std::vector<uint8_t>(data, data + size);
#if GRADZIP_WITH_ZSTD
    case Method::kZstd: return zstd_decompress(data, size, raw_size);
#endif
#if GRADZIP_WITH_BLOSC
    case Method::kBlosc: return blosc_decompress(data, size, raw_size);
#endif
    default: throw PayloadError(missing_library_message("lossless=" + method_name(method), library_of(method)));
  }
}

}  // namespace gradzip::lossless
