#!/usr/bin/env bash
# Runs benchmarks/federated.py's whole-model experiment (c) beside APPFL's own
# ZFPCompressor. APPFL goes into an environment of its own (APPFL_VENV, default
# benchmarks/.appfl-venv), from PyPI: appfl without its dependencies (ray, globus, wandb,
# ... are not needed by its compressors), plus what appfl.compressor imports (zfpy, zstd,
# blosc, omegaconf, numpy, packaging) and the torch gradzip is built against. gradzip
# itself is imported from this checkout (build it first: make build).
#   bash benchmarks/appfl.sh [federated.py arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${APPFL_VENV:-benchmarks/.appfl-venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import appfl.compressor, omegaconf, zfpy, zstd, blosc, torch" 2>/dev/null; then
  torch_version=$(sed -n 's/^torch==//p' scripts/requirements.txt)
  "$VENV/bin/pip" install -q "torch==$torch_version" numpy packaging zfpy zstd blosc omegaconf
  "$VENV/bin/pip" install -q --no-deps appfl
fi
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
  "$VENV/bin/python" benchmarks/federated.py --experiments model --require-appfl \
  --json benchmarks/results/federated_appfl.json "$@"
