#!/usr/bin/env bash
# gradzip beside a second torch, installed as a user installs it: into an environment that
# already holds PyTorch's 2.13.0 CPU wheel (this machine's /opt/wheels), with cmake and ninja
# from PyPI, no system library beyond the compiler (no MPI, libzfp, libzstd or libblosc: each
# turned off), `pip install --no-build-isolation .`; then the smoke set (the tests marked
# torch_range: backend, hook, Aggregation, exact and compressed collectives at 2 ranks, the
# names found by entry point, the version guard, the missing libraries named).
#   scripts/second_torch.sh                 (make test-second-torch; part of make test)
#   SECOND_TORCH=torch==2.14.1 scripts/second_torch.sh     another release, another venv
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${SECOND_TORCH:-torch==2.13.0}
release=${TORCH#torch==}
VENV=${GRADZIP_SECOND_VENV:-$PWD/.venv-torch$release}
BUILD=$PWD/build-torch$release

packages=("$TORCH" numpy pytest cmake ninja setuptools)
stamp="$VENV/.gradzip-second-torch"
if [ ! -x "$VENV/bin/python" ]; then
  echo "second_torch: creating $VENV"
  python3 -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "${packages[*]}" ]; then
  echo "second_torch: pip install ${packages[*]} into $VENV"
  "$VENV/bin/python" -m pip install -q "${packages[@]}"
  echo "${packages[*]}" >"$stamp"
fi

# The user's PATH: the venv's PyPI cmake and ninja first.
export PATH="$VENV/bin:$PATH"
echo "second_torch: building gradzip against $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') in $BUILD"
start=$(date +%s)
GRADZIP_BUILD_TESTS=OFF GRADZIP_BUILD_DIR="$BUILD" \
  GRADZIP_CMAKE_ARGS="-DGRADZIP_MPI=OFF -DGRADZIP_ZFP=OFF -DGRADZIP_ZSTD=OFF -DGRADZIP_BLOSC=OFF" \
  "$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps --force-reinstall . >"$BUILD.log" 2>&1 ||
  { tail -n 60 "$BUILD.log"; echo "second_torch: the install failed (log: $BUILD.log)"; exit 1; }
"$VENV/bin/python" -c 'import gradzip; print("second_torch: installed", gradzip.build_info())'
echo "second_torch: install took $(( $(date +%s) - start )) s"

# From outside the checkout, so that the installed package is the one imported.
cd tests/python
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m torch_range -o testpaths=. \
  test_by_name.py test_build_features.py test_ddp.py test_collectives.py test_compression.py test_spec.py
