"""The spec API: an aggregation named by a spec string, ``name[:key=value[,key=value...]]``
(docs/spec.md), parsed and checked once into a Spec; the names and keys there are.
"""
from ._extension import _C

SpecError = _C.SpecError  # a ValueError
Spec = _C.Spec  # a spec string bound once: Spec("topk:density=0.01"); str(spec) is its canonical text


def bind_spec(spec) -> Spec:
    """A spec string (or a Spec) as a Spec: parsed and checked once (name, keys, values);
    raises SpecError naming what is wrong and listing what is valid."""
    if isinstance(spec, Spec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"gradzip: an aggregation spec is a string or a gradzip.Spec, not {type(spec).__name__}")
    return Spec(spec)


def canonical_spec(spec) -> str:
    """Checks a spec (name, keys, values) and returns its canonical text; raises SpecError."""
    return str(bind_spec(spec))


def aggregations() -> dict:
    """Every aggregation name with a one-line summary and its valid keys, with each key's
    default, valid values and meaning."""
    return {kind["name"]: {"summary": kind["summary"], "keys": [key["name"] for key in kind["all_keys"]],
                           "key_details": kind["all_keys"], "decentralized": kind["decentralized"]}
            for kind in _C.aggregation_kinds()}
