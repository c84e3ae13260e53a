// The system libraries the codec layer can be built without: libzfp (the zfp codec),
// libzstd and libblosc (the lossless stage). A user's `pip install` needs none of them: a
// library missing when gradzip was built turns off only what needs it, and what needs it
// keeps its name, so asking for it is an error that names the library, never "unknown".
#pragma once

#include <string>

namespace gradzip {

enum class SystemLibrary { kZfp, kZstd, kBlosc };

// True when this build was compiled and linked against `library`.
bool built_with(SystemLibrary library);

// "libzfp", "libzstd", "libblosc".
std::string library_name(SystemLibrary library);

// Why `feature` (e.g. "codec 'zfp'") cannot be used in this build: the library it needs,
// and how to get it (Debian's package, then a rebuild).
std::string missing_library_message(const std::string& feature, SystemLibrary library);

}  // namespace gradzip
