#!/usr/bin/env bash
# The C++ tests, and multi-rank Python tests on the extension, built with AddressSanitizer
# and UndefinedBehaviorSanitizer (in build-sanitize/, CPU only). Any report fails the run.
#   scripts/sanitize.sh            the C++ tests and the short multi-rank set (make sanitize)
#   scripts/sanitize.sh -k EXPR    the Python tests selected by EXPR instead
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GRADZIP_VENV:-$(pwd)/.venv}
BUILD=build-sanitize
SELECT="test_every_codec_in_both_exchanges and twophase or aggregation_returns_nan and stc or ddp_hook or choco_keeps or every_collective_matches_gloo and 3 or every_pattern_in_every_order and 3 or any_source_and_named or announcement_past_the_bound or every_layout_sums_exactly and 4-2 or keeps_a_residual_for_its_shard or reduce_scatter_sums_exactly_inside and 4-2 or the_backend_follows_the_loss_scale or layers_in_the_two_phase_exchange and sign or selects_within_each_parameter and topk"
[ "${1:-}" != "-k" ] || SELECT=$2

cmake -S . -B "$BUILD" -G Ninja -DGRADZIP_SANITIZE=ON -DGRADZIP_BUILD_TESTS=ON -DGRADZIP_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
      -DPython_EXECUTABLE="$VENV/bin/python" >/dev/null
cmake --build "$BUILD" -j "${MAX_JOBS:-2}" --target gradzip_tests _C

# Leaks count in the C++ tests; a report of any kind stops the process with an error.
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One process for all the C++ tests: the instrumented runtime starts once, not per case.
"$BUILD/gradzip_tests" --gtest_brief=1

# The extension inside an uninstrumented Python: the runtimes preloaded, the module found
# ahead of the editable install. CPython's own allocations are not leaks worth reporting.
package="$BUILD/python/gradzip"
rm -rf "$package" && mkdir -p "$package"
cp python/gradzip/*.py "$package"/
cp "$BUILD"/_C*.so "$BUILD"/_build.json "$package"/
runtimes="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 LD_PRELOAD="$runtimes" PYTHONPATH="$(pwd)/$BUILD/python"
"$VENV/bin/python" -c "import gradzip._C as c, sys; sys.exit(0 if '/$BUILD/' in c.__file__ else 'sanitize.sh: imported ' + c.__file__)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile tests/python -k "$SELECT"
