"""One spec, bound once, means the same at every door; docs/spec.md's tables are the registries'."""
import pickle
import subprocess
import sys
import pathlib

import pytest
import torch

import gradzip

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_docs_key_tables_are_generated_from_the_registries():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "spec_tables.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_spec_is_bound_once_and_keeps_its_parts():
    spec = gradzip.Spec(" qsgd: seed=7, bits=8 , ef=1")
    assert str(spec) == "qsgd:bits=8,ef=1,seed=7"
    assert spec.name == "qsgd" and spec.codec == "qsgd:bits=8"
    assert spec.error_feedback is True and spec.seed == 7 and not spec.decentralized
    assert spec.params == {"bits": "8", "ef": "1", "seed": "7"}
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert gradzip.Spec("gossip:topology=ring").decentralized and gradzip.Spec("allreduce").codec is None
    assert gradzip.Options(aggregation=spec).resolved_spec() is spec
    with pytest.raises(TypeError, match="a string or a gradzip.Spec"):
        gradzip.canonical_spec(3)


@pytest.mark.torch_range
def test_every_door_takes_the_same_spec():
    text = "topk:density=0.05,ef=0,seed=3,min_numel=10"
    spec = gradzip.Spec(text)
    assert gradzip.canonical_spec(text) == str(spec)
    assert gradzip.Aggregation(text).spec == spec and gradzip.Aggregation(spec).spec == spec
    assert gradzip.hooks.State(text).spec == spec
    x = torch.randn(1000)
    assert gradzip.codec.encode(x, text) == gradzip.codec.encode(x, spec)


def test_key_values_are_checked_by_their_owner_at_every_door():
    for door in (gradzip.canonical_spec, gradzip.Aggregation, gradzip.hooks.State,
                 lambda s: gradzip.codec.encode(torch.ones(4), s)):
        with pytest.raises(gradzip.SpecError, match="density must be a number in \\(0, 1\\], got '2'"):
            door("stc:density=2")
        with pytest.raises(gradzip.SpecError, match="unknown key 'levels' for aggregation 'topk'"):
            door("topk:levels=3")


def test_aggregations_lists_every_key_with_its_default_and_meaning():
    kinds = gradzip.aggregations()
    assert kinds["stc"]["keys"] == ["ef", "exchange", "layers", "adapt_every", "budget", "hierarchy", "rounds", "reduce_scatter", "min_numel", "warmup", "seed",
                                    "density", "density_warmup", "momentum", "approx"]
    assert {k["name"]: k for k in kinds["sign"]["key_details"]}["exchange"]["expects"] == "one of auto, oneshot, twophase"
    details = {k["name"]: k for k in kinds["qsgd"]["key_details"]}
    assert details["bits"]["default"] == "4" and details["norm"]["expects"] == "one of l2, max"
    assert kinds["choco"]["decentralized"] and not kinds["topk"]["decentralized"]


def test_error_feedback_has_one_default_for_every_door():
    """The spec's ef, else the codec's own default: on for the biased codecs."""
    import gradzip
    assert gradzip.Spec("topk:density=0.01").uses_error_feedback
    assert gradzip.Spec("stc:density=0.01").uses_error_feedback
    assert gradzip.Spec("sign").uses_error_feedback
    assert not gradzip.Spec("sign:vote=majority").uses_error_feedback
    assert not gradzip.Spec("qsgd:bits=4").uses_error_feedback
    assert gradzip.Spec("qsgd:bits=4,ef=1").uses_error_feedback
    assert not gradzip.Spec("topk:ef=0").uses_error_feedback
    assert not gradzip.Spec("allreduce").uses_error_feedback
