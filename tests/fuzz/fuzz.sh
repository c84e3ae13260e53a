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
       -Iinclude -Icsrc)
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

printf '%-12s %10s %8s %8s %9s\n' target runs cov ft corpus
for entry in "${TARGETS[@]}"; do
  codec=${entry%%:*} id=${entry##*:}
  binary="$BUILD/fuzz_$codec"
  if [ "$codec" = peer_header ]; then
    $launcher $CXX "${flags[@]}" -fsanitize=fuzzer tests/fuzz/peer_header_fuzzer.cpp "${objects[@]}" "${libraries[@]}" -o "$binary"
  else
    $launcher $CXX "${flags[@]}" -fsanitize=fuzzer -DGRADZIP_FUZZ_CODEC="$id" tests/fuzz/decode_fuzzer.cpp \
      "${objects[@]}" "${libraries[@]}" -o "$binary"
  fi
  regressions="tests/fuzz/regressions/$codec"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    "$binary" -runs=0 "$regressions"/* >"$BUILD/$codec.regressions.log" 2>&1 ||
      { cat "$BUILD/$codec.regressions.log"; echo "fuzz.sh: $codec: a regression input fails again"; exit 1; }
  fi
  work="$BUILD/corpus/$codec"
  mkdir -p "$work"
  log="$BUILD/$codec.log"
  if ! "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$BUILD/findings/$codec-" "$work" "tests/fuzz/corpus/$codec" >"$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz.sh: the $codec decoder failed; the input is in $BUILD/findings/ (add it to $regressions)"
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*')
  corpus=$(grep -o 'corp: [0-9]*' <<<"$last" | grep -o '[0-9]*')
  printf '%-12s %10s %8s %8s %9s\n' "$codec" "$runs" "$cov" "$ft" "$corpus"
done
