#!/usr/bin/env bash
# One command on a GPU machine: build gradzip with its CUDA kernels, run every test that
# needs the GPU (a skip there is a failure), run them again under compute-sanitizer
# (memcheck, racecheck, synccheck), print ptxas's resource report, then benchmark the
# kernels (benchmarks/cuda_kernels.py: one table, JSON in benchmarks/results/) and, with
# two GPUs or more, the end-to-end all_reduce against NCCL (benchmarks/cuda_allreduce.py).
#
#   benchmarks/gpu.sh            # the full benchmark (1M, 10M, 100M elements)
#   benchmarks/gpu.sh --quick    # smaller sizes
set -euo pipefail
cd "$(dirname "$0")/.."

make deps
# nvcc and compute-sanitizer where the CUDA toolkit puts them, when PATH lacks them.
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "gpu.sh: no nvcc (install the CUDA toolkit of torch's CUDA major)"; exit 1; }
PYTHON=${GRADZIP_VENV:-$PWD/.venv}/bin/python
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu.sh: torch sees no GPU")'

# The build, with the CUDA kernels required (configure fails without nvcc).
rm -f build/.installed
GRADZIP_CUDA=ON make build
# Recompile the kernels verbosely to keep ptxas's report (registers, spills, smem).
touch cuda/*.cu
cmake --build build -v 2>&1 | tee build/ptxas.log >/dev/null
"$PYTHON" scripts/ptxas_report.py build/ptxas.log

ctest --test-dir build --output-on-failure
skipped=$(./build/gradzip_tests --gtest_filter='CudaKernelsTest.*' | grep -c '^\[  SKIPPED \]' || true)
[ "$skipped" = 0 ] || { echo "gpu.sh: GPU GoogleTests skipped on a GPU machine"; exit 1; }
"$PYTHON" -m pytest -q -rs tests/python/test_cuda.py | tee build/test_cuda.log
! grep -q "skipped" build/test_cuda.log || { echo "gpu.sh: GPU pytest cases skipped on a GPU machine"; exit 1; }

# Every GPU GoogleTest under each of compute-sanitizer's tools (sizes up to 100003, the
# slowed-down kernels' budget); any report fails the run.
for tool in memcheck racecheck synccheck; do
  GRADZIP_CUDA_TEST_QUICK=1 compute-sanitizer --tool "$tool" --error-exitcode 1 ./build/gradzip_tests \
    --gtest_filter='CudaKernelsTest.*'
done

# The kernels' table; it exits non-zero after printing when a target is missed.
kernels=0
"$PYTHON" benchmarks/cuda_kernels.py "$@" || kernels=$?

# End to end: one rank per GPU (NCCL cannot put two ranks on one GPU).
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
if [ "$gpus" -ge 2 ]; then
  quick=(); [ "${1:-}" = --quick ] && quick=(--numel 4000000)
  "$(dirname "$PYTHON")/torchrun" --standalone --nproc-per-node "$gpus" benchmarks/cuda_allreduce.py "${quick[@]}"
else
  echo "gpu.sh: one GPU: no end-to-end all_reduce table (benchmarks/cuda_allreduce.py needs a GPU per rank)"
fi
exit "$kernels"
