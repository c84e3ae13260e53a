#!/usr/bin/env bash
# Installs what gradzip needs and is missing: Debian packages (as root, or through sudo) and a
# Python virtual environment. Idempotent: a second run with nothing missing changes nothing.
set -euo pipefail

VENV=${GRADZIP_VENV:-$(pwd)/.venv}
# clang and its runtime libraries: the libFuzzer targets (tests/fuzz/fuzz.sh). zfp, zstd and blosc:
# the error-bounded codecs and the lossless stage.
APT_PACKAGES=(g++ cmake ninja-build ccache libgtest-dev openmpi-bin libopenmpi-dev mpich libmpich-dev pkgconf dataset-fashion-mnist
              iproute2 clang libclang-rt-14-dev libzfp-dev libzstd-dev libblosc-dev)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

requirements=scripts/requirements.txt
stamp="$VENV/.gradzip-requirements"
if [ ! -x "$VENV/bin/python" ]; then
  echo "install-deps: creating the virtual environment $VENV"
  python3 -m venv "$VENV"
fi
if ! cmp -s "$requirements" "$stamp"; then
  echo "install-deps: pip install -r $requirements into $VENV"
  "$VENV/bin/python" -m pip install -q -r "$requirements"
  cp "$requirements" "$stamp"
fi
