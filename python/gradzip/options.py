"""Which aggregation a gradzip process group runs, and how it checks its calls.

The aggregation is named by a spec string, ``name[:key=value[,key=value...]]``
(docs/spec.md). A process group takes it from, in order: ``Options(aggregation=...)``
passed as ``pg_options``, then the ``GRADZIP_AGGREGATION`` environment variable, then
``"allreduce"`` (exact).
"""
import os
from dataclasses import dataclass
from typing import Optional

from ._extension import _C

SpecError = _C.SpecError  # a ValueError

_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


@dataclass
class Options:
    """Options of a gradzip process group, passed as ``pg_options``.

    aggregation: the spec of what ``all_reduce`` runs. Default: ``$GRADZIP_AGGREGATION``,
        else ``"allreduce"`` (exact, the transport's own all-reduce).
    validate: before each collective, all ranks confirm they made the same call with
        tensors of the same dtype and size (one small allgather), so a mismatch is an
        error on every rank instead of an aborted process or a hang. Default:
        ``$GRADZIP_VALIDATE``, else on.
    """

    aggregation: Optional[str] = None
    validate: Optional[bool] = None

    def resolved_spec(self) -> str:
        spec = self.aggregation if self.aggregation is not None else os.environ.get("GRADZIP_AGGREGATION")
        return canonical_spec(spec if spec is not None else "allreduce")

    def resolved_validate(self) -> bool:
        if self.validate is not None:
            return bool(self.validate)
        value = os.environ.get("GRADZIP_VALIDATE", "1").strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError(f"GRADZIP_VALIDATE must be 1/0, true/false, on/off or yes/no, not {value!r}")


def canonical_spec(spec: str) -> str:
    """Checks a spec (name, keys, values) and returns its canonical text; raises SpecError."""
    if not isinstance(spec, str):
        raise TypeError(f"gradzip: an aggregation spec is a string, not {type(spec).__name__}")
    return _C.canonical_spec(spec)


def aggregations() -> dict:
    """Every aggregation name with a one-line summary and its valid keys."""
    return {name: {"summary": summary, "keys": list(keys)} for name, summary, keys in _C.aggregation_kinds()}
