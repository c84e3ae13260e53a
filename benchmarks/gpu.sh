#!/usr/bin/env bash
# One command on a GPU machine: build gradzip with its CUDA kernels, run every test that
# needs the GPU (a skip there is a failure), run them again under compute-sanitizer
# (memcheck, racecheck, synccheck), print ptxas's resource report, then benchmark the
# kernels (benchmarks/cuda_kernels.py: one table, JSON in benchmarks/results/) and, with
# two GPUs or more, the end-to-end all_reduce against NCCL (benchmarks/cuda_allreduce.py).
#
#   benchmarks/gpu.sh                          # everything (kernels at 1M, 10M, 100M elements)
#   benchmarks/gpu.sh --quick                  # smaller sizes
#   benchmarks/gpu.sh --only test,sanitize     # some stages (after a build): build, test,
#                                              # sanitize, kernels, allreduce
#   benchmarks/gpu.sh --python PY --debs DIR   # a machine without network: PY's own torch
#
# --python PY uses that Python and the torch, pytest, cmake and ninja it has: no virtual
# environment, no pip download, no apt (the lent GPU machines reach no registry; their
# python3 holds a CUDA torch). gradzip is built against that torch, whatever its version.
# --debs DIR unpacks the Debian packages in DIR into a private prefix that the build and
# the tests use (libzfp, libzstd, libblosc, GoogleTest: what such a machine lacks);
# scripts/gpu_debs.sh fetches them where apt reaches Debian.
#
# A failing stage does not stop the later ones (a first run should tell everything at
# once); the summary at the end names every stage that failed, and the exit status is 1
# if any did. Only a failed build stops the run. A machine that limits each command's
# time can run the stages one --only at a time: the build stays in build/.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=()
stages=build,test,sanitize,kernels,allreduce
given_python=""
debs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    --only) stages=$2; shift ;;
    --python) given_python=$2; shift ;;
    --debs) debs=$2; shift ;;
    *) echo "gpu.sh: unknown argument '$1' (--quick, --only STAGE[,STAGE...], --python PY, --debs DIR)"; exit 2 ;;
  esac
  shift
done
wanted() { [[ ",$stages," == *",$1,"* ]]; }

failed=()
# Runs "$@" as the step named $1 of a stage; a failure is recorded, not fatal.
step() {
  local name=$1
  shift
  echo "=== gpu.sh: $name"
  if "$@"; then echo "=== gpu.sh: $name: ok"; else echo "=== gpu.sh: $name: FAILED"; failed+=("$name"); fi
}

# nvcc and compute-sanitizer where the CUDA toolkit puts them, when PATH lacks them.
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
if [ -n "$given_python" ]; then
  PYTHON=$given_python
  [ -x "$PYTHON" ] || { echo "gpu.sh: --python $PYTHON is not an executable"; exit 2; }
  export PATH="$(dirname "$PYTHON"):$PATH"  # its cmake, ninja, ctest and torchrun
else
  PYTHON=${GRADZIP_VENV:-$PWD/.venv}/bin/python
fi
if [ -n "$debs" ]; then
  prefix=${TMPDIR:-/tmp}/gradzip-debs
  for deb in "$debs"/*.deb; do
    dpkg-deb -x "$deb" "$prefix" || { echo "gpu.sh: could not unpack $deb"; exit 1; }
  done
  libdir=$prefix/usr/lib/$(uname -m)-linux-gnu
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "gpu.sh: the packages of $debs unpacked in $prefix"
fi

if wanted build; then
  command -v nvcc >/dev/null || { echo "gpu.sh: no nvcc (install the CUDA toolkit of torch's CUDA major)"; exit 1; }
  # The build, with the CUDA kernels required (configure fails without nvcc).
  if [ -n "$given_python" ]; then
    # No MPI transport: an MPI found by chance on such a machine is not what its tests need.
    GRADZIP_CUDA=ON GRADZIP_CMAKE_ARGS="-DGRADZIP_MPI=OFF" "$PYTHON" -m pip install -q --no-build-isolation \
      --no-deps --no-index -e . || { echo "gpu.sh: the build failed; nothing else can run"; exit 1; }
  else
    make deps || { echo "gpu.sh: make deps failed"; exit 1; }
    rm -f build/.installed
    GRADZIP_CUDA=ON make build || { echo "gpu.sh: the build failed; nothing else can run"; exit 1; }
  fi
  # Recompile the kernels verbosely to keep ptxas's report (registers, spills, smem).
  touch cuda/*.cu
  cmake --build build -v 2>&1 | tee build/ptxas.log >/dev/null
  step "ptxas report" "$PYTHON" scripts/ptxas_report.py build/ptxas.log
fi
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu.sh: torch sees no GPU")' || exit 1

gtest_without_skips() {
  local skipped
  skipped=$(./build/gradzip_tests --gtest_filter='CudaKernelsTest.*' | tee build/gtest_cuda.log |
            grep -c '^\[  SKIPPED \]' || true)
  grep -q '^\[  PASSED  \]' build/gtest_cuda.log && ! grep -q '^\[  FAILED  \]' build/gtest_cuda.log &&
    [ "$skipped" = 0 ]
}
pytest_without_skips() {
  # Several workers where pytest-xdist is there (the lent machines have it): most of the
  # time goes into starting ranks, not into the GPU.
  local workers=()
  "$PYTHON" -c 'import xdist' 2>/dev/null && workers=(-n 8)
  "$PYTHON" -m pytest -q -rs "${workers[@]}" tests/python/test_cuda.py | tee build/test_cuda.log &&
    ! grep -q "skipped" build/test_cuda.log
}
if wanted test; then
  # The GPU GoogleTests once, in the next step (which also fails on a skip).
  step "ctest" ctest --test-dir build --output-on-failure -E '^CudaKernelsTest\.'
  step "GPU GoogleTests, none skipped" gtest_without_skips
  step "tests/python/test_cuda.py, none skipped" pytest_without_skips
fi

# Every GPU GoogleTest under each of compute-sanitizer's tools (sizes up to 100003, the
# slowed-down kernels' budget); any report fails the step.
if wanted sanitize; then
  for tool in memcheck racecheck synccheck; do
    step "compute-sanitizer $tool" env GRADZIP_CUDA_TEST_QUICK=1 \
      compute-sanitizer --tool "$tool" --error-exitcode 1 ./build/gradzip_tests --gtest_filter='CudaKernelsTest.*'
  done
fi

# The kernels' table; it exits non-zero after printing when a target is missed.
if wanted kernels; then
  step "benchmarks/cuda_kernels.py (targets met)" "$PYTHON" benchmarks/cuda_kernels.py "${quick[@]}"
fi

# End to end: one rank per GPU (NCCL cannot put two ranks on one GPU).
if wanted allreduce; then
  gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
  if [ "$gpus" -ge 2 ]; then
    numel=(); [ ${#quick[@]} -gt 0 ] && numel=(--numel 4000000)
    step "benchmarks/cuda_allreduce.py" "$(dirname "$PYTHON")/torchrun" --standalone --nproc-per-node "$gpus" \
      benchmarks/cuda_allreduce.py "${numel[@]}"
  else
    echo "gpu.sh: one GPU: no end-to-end all_reduce table (benchmarks/cuda_allreduce.py needs a GPU per rank)"
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  (IFS=';'; echo "gpu.sh: FAILED: ${failed[*]}")
  exit 1
fi
echo "gpu.sh: every stage asked for passed ($stages)"
