#include "codec/system_libraries.h"

namespace gradzip {

bool built_with(SystemLibrary library) {
  switch (library) {
    case SystemLibrary::kZfp: return GRADZIP_WITH_ZFP;
    case SystemLibrary::kZstd: return GRADZIP_WITH_ZSTD;
    case SystemLibrary::kBlosc: return GRADZIP_WITH_BLOSC;
  }
  return false;
}

std::string library_name(SystemLibrary library) {
  switch (library) {
    case SystemLibrary::kZfp: return "libzfp";
    case SystemLibrary::kZstd: return "libzstd";
    case SystemLibrary::kBlosc: return "libblosc";
  }
  return "an unknown library";
}

std::string missing_library_message(const std::string& feature, SystemLibrary library) {
  const std::string name = library_name(library);
  return "gradzip: " + feature + " needs " + name + ", which this build of gradzip was made without: install " +
         name + "'s headers (Debian: " + name + "-dev) and rebuild gradzip (pip install --no-build-isolation .)";
}

}  // namespace gradzip
