#!/usr/bin/env bash
# One command on a GPU machine: build gradzip with its CUDA kernels (ptxas's resource
# report kept), run every test that needs the GPU (a skip there is a failure), benchmark
# the kernels (benchmarks/cuda_kernels.py), run the GPU GoogleTests under
# compute-sanitizer, with two GPUs or more the end-to-end all_reduce against NCCL
# (benchmarks/cuda_allreduce.py), and a short GPU time-to-accuracy run of 4 ranks
# (benchmarks/train.py --device cuda).
#
#   benchmarks/gpu.sh                          # every stage (kernels at 1M, 10M, 100M elements)
#   benchmarks/gpu.sh --quick                  # smaller sizes
#   benchmarks/gpu.sh --only build,test        # some stages: build, test, cputest,
#                                              # kernels, sanitize, allreduce, train
#   benchmarks/gpu.sh --python PY --debs DIR   # a machine without network: PY's own torch
#
# Options for a machine borrowed for minutes (docs/cuda.md, "First run on a GPU machine"):
#   --out DIR         logs, JUnit XML, JSON and summary.txt go there (default build/gpu-out)
#   --arch LIST       CUDA architectures to build, CMake's syntax (default "80-real;90"): 90
#   --deadline S      the whole run ends within S seconds: every step runs under `timeout`
#                     with what is left (less a reserve for the summary); a step that
#                     would start with under 20 s left is recorded as not run
#   --sanitize-tools  memcheck,racecheck,synccheck (the default) or a subset
#   --sanitize-filter a GoogleTest filter for the sanitized subset (default CudaKernelsTest.*)
#
# --python PY uses that Python and the torch, pytest, cmake and ninja it has: no virtual
# environment, no pip download, no apt (the lent GPU machines reach no registry; their
# python3 holds a CUDA torch). gradzip is built against that torch, whatever its version.
# --debs DIR unpacks the Debian packages in DIR into a private prefix that the build uses
# (libzfp, libzstd, libblosc, GoogleTest: what such a machine lacks); at run time only the
# libraries the system does not have are put on LD_LIBRARY_PATH (system libraries first).
# scripts/gpu_debs.sh fetches the packages where apt reaches Debian.
#
# Every stage is self-contained after a build in the same command (nothing but build/ is
# reused), so a fresh machine needs the build stage in the same command. A failing step
# does not stop the later ones; the summary (also in DIR/summary.txt) names every step
# that failed or did not run (the deadline; a compute-sanitizer missing or not supporting
# the GPU), and the exit status is 1 if any did. Only a failed build
# stops the run.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

quick=()
stages=build,test,cputest,kernels,sanitize,allreduce,train
given_python=""
debs=""
out=build/gpu-out
arch=""
deadline=""
sanitize_tools=memcheck,racecheck,synccheck
sanitize_filter='CudaKernelsTest.*'
usage="(--quick, --only STAGE[,STAGE...], --python PY, --debs DIR, --out DIR, --arch LIST, --deadline S, --sanitize-tools T[,T...], --sanitize-filter F)"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    --only) stages=$2; shift ;;
    --python) given_python=$2; shift ;;
    --debs) debs=$2; shift ;;
    --out) out=$2; shift ;;
    --arch) arch=$2; shift ;;
    --deadline) deadline=$2; shift ;;
    --sanitize-tools) sanitize_tools=$2; shift ;;
    --sanitize-filter) sanitize_filter=$2; shift ;;
    *) echo "gpu.sh: unknown argument '$1' $usage"; exit 2 ;;
  esac
  shift
done
for stage in ${stages//,/ }; do
  case "$stage" in
    build|test|cputest|sanitize|kernels|allreduce|train) ;;
    *) echo "gpu.sh: unknown stage '$stage' (build, test, cputest, sanitize, kernels, allreduce, train)"; exit 2 ;;
  esac
done
if [ -n "$deadline" ] && ! [[ "$deadline" =~ ^[0-9]+$ ]]; then
  echo "gpu.sh: --deadline takes whole seconds, not '$deadline'"; exit 2
fi
wanted() { [[ ",$stages," == *",$1,"* ]]; }
mkdir -p "$out" || { echo "gpu.sh: cannot make the output folder $out"; exit 2; }
out=$(cd "$out" && pwd)
exec > >(tee "$out/gpu.log") 2>&1

failed=()
not_run=()
# The exit status of a step that found this machine cannot run it (a tool that does not
# support the GPU): recorded as not run, not as failed.
cannot_run=77
# Seconds a step may take: what is left before the deadline, less 10 s for the summary.
time_left() {
  if [ -z "$deadline" ]; then echo 86400; else echo $((deadline - (SECONDS - started) - 10)); fi
}
# Runs "$@" as the step named $1 under the time left; a failure is recorded, not fatal.
step() {
  local name=$1 left rc
  shift
  left=$(time_left)
  if [ "$left" -lt 20 ]; then
    echo "=== gpu.sh: $name: NOT RUN (deadline)"; not_run+=("$name"); return 1
  fi
  echo "=== gpu.sh: $name (at $((SECONDS - started)) s, ${left} s left)"
  local begun=$SECONDS
  # bash -c: a step may be one of this script's functions (exported below).
  timeout --kill-after=5 "$left" bash -c '"$@"' step "$@"
  rc=$?
  if [ $rc = 0 ]; then
    echo "=== gpu.sh: $name: ok ($((SECONDS - begun)) s)"
  elif [ $rc = $cannot_run ]; then
    echo "=== gpu.sh: $name: NOT RUN (this machine cannot run it)"; not_run+=("$name")
  else
    [ $rc = 124 ] && echo "=== gpu.sh: $name: timed out after $((SECONDS - begun)) s"
    echo "=== gpu.sh: $name: FAILED (exit $rc)"; failed+=("$name")
  fi
  return $rc
}
finish() {
  {
    [ ${#failed[@]} -gt 0 ] && (IFS=';'; echo "gpu.sh: FAILED: ${failed[*]}")
    [ ${#not_run[@]} -gt 0 ] && (IFS=';'; echo "gpu.sh: NOT RUN: ${not_run[*]}")
    if [ ${#failed[@]} = 0 ] && [ ${#not_run[@]} = 0 ]; then
      echo "gpu.sh: every stage asked for passed ($stages) in $((SECONDS - started)) s"
    fi
  } | tee "$out/summary.txt"
  [ ${#failed[@]} = 0 ] && [ ${#not_run[@]} = 0 ]
  exit $?
}

# nvcc and compute-sanitizer where the CUDA toolkit puts them, when PATH lacks them
# (each on its own: an nvcc found elsewhere does not bring compute-sanitizer).
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
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
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  # At run time, only the libraries the system lacks: a link to each in a folder of its own.
  libdir=$prefix/usr/lib/$(uname -m)-linux-gnu
  runtime=$prefix/runtime
  mkdir -p "$runtime"
  known=$( (ldconfig -p 2>/dev/null || true) | awk 'NR > 1 {print $1}')
  for lib in "$libdir"/lib*.so.*; do
    [ -e "$lib" ] || continue
    name=$(basename "$lib")
    grep -qxF "$name" <<<"$known" || ln -sf "$lib" "$runtime/$name"
  done
  export LD_LIBRARY_PATH="$runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "gpu.sh: the packages of $debs unpacked in $prefix; at run time from there: $(ls "$runtime" | tr '\n' ' ')"
fi

build_with_python() {
  # No MPI transport: an MPI found by chance on such a machine is not what its tests need.
  GRADZIP_CUDA=ON GRADZIP_BUILD_TESTS=ON GRADZIP_CMAKE_ARGS="-DGRADZIP_MPI=OFF ${arch:+-DGRADZIP_CUDA_ARCHITECTURES=$arch}" \
    "$PYTHON" -m pip install -v --no-build-isolation --no-deps --no-index -e . >"$out/build.log" 2>&1
}
build_with_make() {
  make deps >"$out/build.log" 2>&1 || return 1
  rm -f build/.installed
  GRADZIP_CUDA=ON GRADZIP_CMAKE_ARGS="${arch:+-DGRADZIP_CUDA_ARCHITECTURES=$arch}" make build >>"$out/build.log" 2>&1
}
export out arch PYTHON
export -f build_with_python build_with_make
if wanted build; then
  command -v nvcc >/dev/null || { echo "gpu.sh: no nvcc (install the CUDA toolkit of torch's CUDA major)"; failed+=(nvcc); finish; }
  builder=build_with_make
  [ -n "$given_python" ] && builder=build_with_python
  if ! step "build${arch:+ (arch $arch)}" "$builder"; then
    tail -n 60 "$out/build.log"
    echo "gpu.sh: the build failed; nothing else can run"
    finish
  fi
  # The kernels compile with -Xptxas=-v: the report comes from the build's own log.
  step "ptxas report" sh -c '"$0" scripts/ptxas_report.py "$1" | tee "$2"' "$PYTHON" "$out/build.log" "$out/ptxas.txt"
fi
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu.sh: torch sees no GPU")' ||
  { failed+=("a GPU visible to torch"); finish; }

# The GPU GoogleTests once; a skip fails, and the failures' own lines are shown.
gtest_without_skips() {
  ./build/gradzip_tests --gtest_filter='Cuda*' --gtest_output="xml:$out/gtest_cuda.xml" >"$out/gtest_cuda.log" 2>&1
  local rc=$?
  grep -E '^\[  (FAILED|SKIPPED) \]|Failure|error' "$out/gtest_cuda.log" | head -n 80
  tail -n 3 "$out/gtest_cuda.log"
  [ $rc = 0 ] && grep -q '^\[  PASSED  \]' "$out/gtest_cuda.log" && ! grep -q '^\[  SKIPPED \]' "$out/gtest_cuda.log"
}
pytest_without_skips() {
  # Several workers where pytest-xdist is there (the lent machines have it): most of the
  # time goes into starting ranks, not into the GPU.
  local workers=()
  "$PYTHON" -c 'import xdist' 2>/dev/null && workers=(-n 8)
  "$PYTHON" -m pytest -q -rs "${workers[@]}" --junitxml="$out/test_cuda.xml" tests/python/test_cuda.py tests/python/test_gpu_ranks.py \
    >"$out/test_cuda.log" 2>&1
  local rc=$?
  grep -E '^(FAILED|ERROR|SKIPPED)|Error|assert' "$out/test_cuda.log" | head -n 80
  tail -n 3 "$out/test_cuda.log"
  [ $rc = 0 ] && ! grep -q "skipped" "$out/test_cuda.log"
}
export -f gtest_without_skips pytest_without_skips
if wanted test; then
  step "GPU GoogleTests, none skipped" gtest_without_skips
  step "tests/python/test_cuda.py and test_gpu_ranks.py, none skipped" pytest_without_skips
fi
if wanted cputest; then
  step "ctest (CPU)" sh -c 'ctest --test-dir build --output-on-failure -j8 -E "^Cuda" >"$0" 2>&1; rc=$?; tail -n 40 "$0"; exit $rc' "$out/ctest.log"
fi

# The kernels' table; it exits non-zero after printing when a target is missed.
if wanted kernels; then
  step "benchmarks/cuda_kernels.py (targets met)" "$PYTHON" benchmarks/cuda_kernels.py "${quick[@]}" --out "$out/cuda_kernels.json"
fi

# The chosen GPU GoogleTests under each chosen compute-sanitizer tool (sizes up to 100003,
# the slowed-down kernels' budget); any report fails the step. A compute-sanitizer that
# is missing, or that does not support this GPU ("Device not supported", as on one H200
# machine type), leaves the step not run.
if wanted sanitize; then
  for tool in ${sanitize_tools//,/ }; do
    step "compute-sanitizer $tool" sh -c 'command -v compute-sanitizer >/dev/null || { echo "gpu.sh: no compute-sanitizer on PATH"; exit $3; }; env GRADZIP_CUDA_TEST_QUICK=1 compute-sanitizer --tool "$1" --error-exitcode 1 ./build/gradzip_tests --gtest_filter="$2" >"$0" 2>&1; rc=$?; grep -E "=========|FAILED" "$0" | head -n 60; tail -n 3 "$0"; [ $rc != 0 ] && grep -qi "device not supported" "$0" && exit $3; exit $rc' \
      "$out/sanitize_$tool.log" "$tool" "$sanitize_filter" "$cannot_run"
  done
fi

# Time to accuracy on the GPU: 4 ranks sharing the GPUs (over Gloo through host memory
# where they share one), ResNet-18 on Fashion-MNIST, dense DDP against PyTorch's fp16 and
# PowerSGD hooks and gradzip's codecs, on loopback, and on links shaped to 10 and 1 Gbit/s
# where network namespaces can be made (the step says whether they can). The data: $FASHION_MNIST_DIR, else
# Debian's dataset-fashion-mnist (from --debs, which scripts/gpu_debs.sh fills, or
# installed); without it the step is not run.
if wanted train; then
  data=/usr/share/datasets/fashion-mnist
  [ -n "$debs" ] && [ -d "$prefix$data" ] && data=$prefix$data
  data=${FASHION_MNIST_DIR:-$data}
  if [ -f "$data/train-images-idx3-ubyte.gz" ]; then
    size=(--epochs 3 --max-steps 40); [ ${#quick[@]} -gt 0 ] && size=(--epochs 1 --max-steps 10)
    run=(benchmarks/train.py --device cuda --model resnet --methods gpu "${size[@]}" --target dense-0.01 --stop-at-target)
    step "benchmarks/train.py --device cuda, 4 ranks, loopback" env FASHION_MNIST_DIR="$data" \
      "$(dirname "$PYTHON")/torchrun" --standalone --nproc-per-node 4 "${run[@]}" --out "$out/train_gpu"
    # Shaped links where this machine lets a script make network namespaces (root and
    # iproute2); the full run only (--quick stops at loopback), 10 then 1 Gbit/s.
    probe=gz-probe-$$
    if ip netns add "$probe" 2>/dev/null && ip netns delete "$probe" 2>/dev/null; then
      echo "gpu.sh: network namespaces work here: shaped time-to-accuracy runs are possible (benchmarks/netns.sh)"
      if [ ${#quick[@]} = 0 ]; then
        for rate in 10gbit 1gbit; do
          step "benchmarks/train.py --device cuda, 4 ranks, $rate (netns.sh)" env FASHION_MNIST_DIR="$data" \
            benchmarks/netns.sh --ranks 4 --rate "$rate" -- "$PYTHON" "${run[@]}" --out "$out/train_gpu_$rate"
        done
      fi
    else
      echo "gpu.sh: no network namespaces here (ip netns add failed: not root, or no iproute2): the" \
        "time-to-accuracy run is on loopback only"
    fi
  else
    echo "=== gpu.sh: benchmarks/train.py: NOT RUN (no Fashion-MNIST at $data: set FASHION_MNIST_DIR)"
    not_run+=("benchmarks/train.py --device cuda")
  fi
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
finish
