"""Which aggregation a gradzip process group runs, and how it checks its calls.

The aggregation is named by a spec string, ``name[:key=value[,key=value...]]``
(docs/spec.md). A process group takes it from, in order: ``Options(aggregation=...)``
passed as ``pg_options``, then the ``GRADZIP_AGGREGATION`` environment variable, then
``"allreduce"`` (exact).
"""
import os
from dataclasses import dataclass
from typing import Optional, Union

from ._extension import _C
from .mpi import resolve_transport

SpecError = _C.SpecError  # a ValueError
Spec = _C.Spec  # a spec string bound once: Spec("topk:density=0.01"); str(spec) is its canonical text

_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


@dataclass
class Options:
    """Options of a gradzip process group, passed as ``pg_options``.

    aggregation: the spec of what ``all_reduce`` runs. Default: ``$GRADZIP_AGGREGATION``,
        else ``"allreduce"`` (exact, the transport's own all-reduce).
    validate: before each collective, all ranks confirm they made the same call with
        tensors of the same dtype and size (one small all-to-all of fingerprints, or a
        board in shared memory when every rank is on one host), so a mismatch is an
        error on every rank instead of an aborted process or a hang. Default:
        ``$GRADZIP_VALIDATE``, else on.
    transport: what carries CPU tensors: ``"mpi"`` (gradzip.mpi, over the Open MPI or
        MPICH the build links) or ``"gloo"``. Default: ``$GRADZIP_TRANSPORT``, else
        ``"mpi"`` when that MPI's launcher started the job, else ``"gloo"``.
    """

    aggregation: Union[str, Spec, None] = None
    validate: Optional[bool] = None
    transport: Optional[str] = None

    def resolved_spec(self) -> Spec:
        spec = self.aggregation if self.aggregation is not None else os.environ.get("GRADZIP_AGGREGATION")
        return bind_spec(spec if spec is not None else "allreduce")

    def resolved_validate(self) -> bool:
        if self.validate is not None:
            return bool(self.validate)
        value = os.environ.get("GRADZIP_VALIDATE", "1").strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError(f"GRADZIP_VALIDATE must be 1/0, true/false, on/off or yes/no, not {value!r}")


    def resolved_transport(self) -> str:
        return resolve_transport(self.transport)


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
