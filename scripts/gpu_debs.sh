#!/usr/bin/env bash
# Fetches the Debian packages whose libraries gradzip's build needs and a GPU machine
# without network may lack (the lent ones: libzfp, libzstd, libblosc and their runtime
# libraries, GoogleTest), and Fashion-MNIST for its time-to-accuracy run
# (dataset-fashion-mnist, 31 MB), into DIR (default .gpu-debs, which git ignores), for
# `benchmarks/gpu.sh --python PY --debs DIR` there. Run it where apt reaches Debian.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-debs}
mkdir -p "$dir"
packages=(libzfp-dev libzfp1 libzstd-dev libzstd1 libblosc-dev libblosc1 liblz4-1 libsnappy1v5 libgtest-dev
          dataset-fashion-mnist)
(cd "$dir" && apt-get download "${packages[@]}")
echo "gpu_debs: $(ls "$dir"/*.deb | wc -l) packages in $dir ($(du -sh "$dir" | cut -f1))"
