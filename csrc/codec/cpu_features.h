// What this CPU runs, asked once per process: the codecs' loops compiled for AVX2 or
// AVX-512 (__attribute__((target(...)))) are called only where these say so; the
// baseline build runs everywhere else.
#pragma once

namespace gradzip {

inline const bool kHasAvx2 = __builtin_cpu_supports("avx2");
inline const bool kHasAvx512 = __builtin_cpu_supports("avx512f");

}  // namespace gradzip
