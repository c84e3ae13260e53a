#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of bytes from another rank: one libFuzzer
# binary per codec (decode_fuzzer.cpp) and one for gossip/choco message headers
# (peer_header_fuzzer.cpp), built by clang with AddressSanitizer and UndefinedBehavior-
# Sanitizer (build-fuzz/), run for SECONDS each on its seed corpus (tests/fuzz/corpus/
# <target>) after replaying every input that once crashed it (tests/fuzz/regressions/<target>). A crash, a leak, a timeout or a
# sanitizer report fails the run and leaves the input in build-fuzz/findings/.
#   tests/fuzz/fuzz.sh [SECONDS]      default 15 (make test's budget); campaigns: 3600
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-15}
BUILD=build-fuzz
CXX=${FUZZ_CXX:-clang++}
command -v "$CXX" >/dev/null || { echo "fuzz.sh: $CXX not found (apt-get install clang libclang-rt-14-dev)"; exit 1; }
launcher=$(command -v ccache || true)
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
       -Iinclude -Icsrc -DGRADZIP_WITH_ZFP=1 -DGRADZIP_WITH_ZSTD=1 -DGRADZIP_WITH_BLOSC=1)
libraries=(-lzfp -lzstd -lblosc)  # the error-bounded codecs and the lossless stage (Debian)

mkdir -p "$BUILD/obj" "$BUILD/findings"
objects=()
sources=(csrc/codec/*.cpp csrc/aggregate/peer_header.cpp)
for source in "${sources[@]}"; do objects+=("$BUILD/obj/$(basename "${source%.cpp}").o"); done
for source in "${sources[@]}"; do
  object="$BUILD/obj/$(basename "${source%.cpp}").o"
  if [ ! -f "$object" ] || [ "$source" -nt "$object" ] ||
     [ -n "$(find csrc/codec csrc/aggregate/peer_header.h include -newer "$object" -name '*.h' | head -1)" ]; then
    echo "$source"
  fi
done | xargs -r -P "${MAX_JOBS:-2}" -I{} sh -c \
  "$launcher $CXX ${flags[*]} -fsanitize=fuzzer-no-link -c {} -o $BUILD/obj/\$(basename {} .cpp).o"

# The targets: every codec in the registry (name:id), then the gossip message headers.
$launcher $CXX "${flags[@]}" tests/fuzz/codec_ids.cpp "${objects[@]}" "${libraries[@]}" -o "$BUILD/codec_ids"
mapfile -t TARGETS < <("$BUILD/codec_ids")
[ ${#TARGETS[@]} -gt 0 ] || { echo "fuzz.sh: the registry lists no codecs"; exit 1; }
TARGETS+=(peer_header:0)
for entry in "${TARGETS[@]}"; do
  [ -d "tests/fuzz/corpus/${entry%%:*}" ] ||
    { echo "fuzz.sh: no seed corpus for ${entry%%:*} (add it to tests/fuzz/make_corpus.py and run it)"; exit 1; }
done

# The functions below run in xargs's shells: the lists travel as words (no path has a space).
export BUILD CXX launcher seconds FLAGS="${flags[*]}" OBJECTS="${objects[*]}" LIBRARIES="${libraries[*]}"
# Every target's binary: its fuzzer compiled alone (so ccache keeps it), then linked.
build_target() {
  local codec=${1%%:*} id=${1##*:} source=tests/fuzz/decode_fuzzer.cpp
  [ "$codec" != peer_header ] || source=tests/fuzz/peer_header_fuzzer.cpp
  $launcher $CXX $FLAGS -fsanitize=fuzzer-no-link -DGRADZIP_FUZZ_CODEC="$id" -c "$source" -o "$BUILD/obj/fuzz_$codec.o" &&
    $CXX $FLAGS -fsanitize=fuzzer "$BUILD/obj/fuzz_$codec.o" $OBJECTS $LIBRARIES -o "$BUILD/fuzz_$codec"
}
# The regressions, then SECONDS of fuzzing; what failed goes to $BUILD/<codec>.failed.
fuzz_target() {
  local codec=${1%%:*} binary="$BUILD/fuzz_${1%%:*}" regressions="tests/fuzz/regressions/${1%%:*}"
  rm -f "$BUILD/$codec.failed"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ] &&
     ! "$binary" -runs=0 "$regressions"/* >"$BUILD/$codec.regressions.log" 2>&1; then
    cat "$BUILD/$codec.regressions.log" >"$BUILD/$codec.failed"
    echo "fuzz.sh: $codec: a regression input fails again" >>"$BUILD/$codec.failed"
    return
  fi
  mkdir -p "$BUILD/corpus/$codec"
  if ! "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$BUILD/findings/$codec-" "$BUILD/corpus/$codec" "tests/fuzz/corpus/$codec" >"$BUILD/$codec.log" 2>&1; then
    tail -60 "$BUILD/$codec.log" >"$BUILD/$codec.failed"
    echo "fuzz.sh: the $codec decoder failed; the input is in $BUILD/findings/ (add it to $regressions)" >>"$BUILD/$codec.failed"
  fi
}
export -f build_target fuzz_target
# The targets run side by side, as many as the build may use (each fuzzer is one thread).
printf '%s\n' "${TARGETS[@]}" | xargs -P "${MAX_JOBS:-2}" -I{} bash -c 'build_target {} && fuzz_target {}' ||
  { echo "fuzz.sh: a fuzzer did not build"; exit 1; }

printf '%-12s %10s %8s %8s %9s\n' target runs cov ft corpus
failed=0
for entry in "${TARGETS[@]}"; do
  codec=${entry%%:*} log="$BUILD/${entry%%:*}.log"
  if [ -f "$BUILD/$codec.failed" ]; then cat "$BUILD/$codec.failed"; failed=1; continue; fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*')
  corpus=$(grep -o 'corp: [0-9]*' <<<"$last" | grep -o '[0-9]*')
  printf '%-12s %10s %8s %8s %9s\n' "$codec" "$runs" "$cov" "$ft" "$corpus"
done
exit $failed
