// What this CPU runs, asked once per process: the codecs' loops compiled for AVX2 or
// AVX-512 (__attribute__((target(...)))) are called only where these say so; the
// baseline build runs everywhere else.
#pragma once

namespace gradzip {

inline const bool kHasAvx2 = __builtin_cpu_supports("avx2");
inline const bool kHasAvx512 = __builtin_cpu_supports("avx512f");

// Above this many bytes, a pass whose output is not read again soon writes it past the
// caches (AVX2 streaming stores): it skips reading the old lines in before writing them,
// and leaves the caches to what is (on the Xeon of docs/results.md, a pass of 11.9M
// elements took about half the time of plain stores).
constexpr long long kStreamBytes = 8ll << 20;

}  // namespace gradzip
