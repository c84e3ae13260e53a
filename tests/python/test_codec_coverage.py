"""Every hand-written list of codec specs the tests and the fuzzers run names every codec
in the registry (the CUDA tests: every codec with kernels), so a new codec cannot be left
out of them unnoticed. The lists stay hand-written because each spec picks parameters that
reach a code path; this checks them against the registry instead."""
import sys
from pathlib import Path

import pytest

import gradzip

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
import make_corpus  # noqa: E402
sys.path.pop(0)

import test_compression  # noqa: E402
import test_cuda  # noqa: E402
import test_hierarchy  # noqa: E402


def registered(device_only=False):
    return {kind["name"] for kind in gradzip._C.codec_kinds() if kind["device"] or not device_only}


def codecs_of(specs):
    texts = (spec.values[0] if hasattr(spec, "values") else spec for spec in specs)  # pytest.param(spec, marks=...)
    return {text.partition(":")[0] for text in texts}


@pytest.mark.parametrize("name, specs, device_only", [
    ("test_compression.SPECS (three doors)", test_compression.SPECS, False),
    ("test_hierarchy.CODEC_SPECS", test_hierarchy.CODEC_SPECS, False),
    ("test_cuda.SPECS (kernels against the CPU codec)", test_cuda.SPECS, True),
    ("tests/fuzz/make_corpus.py SPECS (seed corpus)", list(make_corpus.SPECS), False),
])
def test_spec_list_names_every_registered_codec(name, specs, device_only):
    missing = registered(device_only) - codecs_of(specs)
    assert not missing, f"{name} has no spec for {sorted(missing)}"


def test_every_seeded_codec_has_its_corpus_folder():
    for codec in make_corpus.SPECS:
        assert (ROOT / "tests" / "fuzz" / "corpus" / codec).is_dir(), f"run tests/fuzz/make_corpus.py for {codec}"
