# gradzip: the whole set-up is `make demo` (main job) and `make test` (every test).
# Both install what is missing (apt packages, a virtual environment), build, then run.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

VENV ?= $(or $(GRADZIP_VENV),$(CURDIR)/.venv)
PYTHON := $(VENV)/bin/python
export GRADZIP_VENV := $(VENV)
export MAX_JOBS ?= 2
# Developers' builds carry the GoogleTest binaries too (a user's pip install builds the extension alone).
export GRADZIP_BUILD_TESTS ?= ON
# The demo's ranks run on this machine's cores: one thread each keeps them from fighting.
export OMP_NUM_THREADS ?= 1
# ccache shares compilations between clones: paths under this checkout are hashed as
# relative ones, and debug builds do not hash the working directory.
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1

NPROC ?= 4
EPOCHS ?= 3
SPEC ?= stc:density=0.01,momentum=0.9,density_warmup=234
BUILD_SOURCES := $(shell find include csrc cuda tests/cpp -type f 2>/dev/null) CMakeLists.txt setup.py pyproject.toml

.PHONY: all deps build test test-cpp test-python test-second-torch sanitize fuzz demo bench clean
all: build

deps:
	@scripts/install-deps.sh

# pip drives CMake (setup.py); the stamp keeps a second `make` from rebuilding.
build/.installed: $(BUILD_SOURCES) scripts/requirements.txt | deps
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	@touch $@

build: deps build/.installed

test-cpp: build
	ctest --test-dir build --output-on-failure --no-tests=error -j $(MAX_JOBS)

# Two pytest workers, each running one test file at a time (so module fixtures run once):
# one worker alone keeps 0.6 of two cores busy (ranks wait on sockets, launchers, timeouts).
# Exported: the sanitizer stage (scripts/sanitize.sh) runs its pytest set on as many.
export PYTEST_WORKERS ?= 2
test-python: build
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=15 tests/python

# gradzip built as a user builds it beside a second torch (PyTorch's 2.13.0 CPU wheel), and the smoke set there.
test-second-torch: deps
	scripts/second_torch.sh

# The C++ tests and a multi-rank Python set under AddressSanitizer + UBSan (build-sanitize/).
sanitize: build
	scripts/sanitize.sh

# Every codec's decoder under libFuzzer, FUZZ_SECONDS each (campaigns: make fuzz FUZZ_SECONDS=3600).
FUZZ_SECONDS ?= 10
fuzz: deps
	tests/fuzz/fuzz.sh $(FUZZ_SECONDS)

test: test-cpp test-python test-second-torch sanitize fuzz

demo: build
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(NPROC) examples/train_fashion_mnist.py --epochs $(EPOCHS) --spec "$(SPEC)"

bench: build
	$(VENV)/bin/torchrun --standalone --nproc-per-node 4 benchmarks/collectives.py
	$(PYTHON) benchmarks/codecs.py
	$(VENV)/bin/torchrun --standalone --nproc-per-node 8 benchmarks/consensus.py
	$(PYTHON) benchmarks/federated.py
	$(PYTHON) benchmarks/decoder_cost.py
	$(PYTHON) benchmarks/model_codecs.py

clean:
	rm -rf build build-sanitize build-fuzz build-torch* python/gradzip/_C*.so python/gradzip/_build.json
