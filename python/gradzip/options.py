"""Which aggregation a gradzip process group runs, and how it checks its calls.

The aggregation is named by a spec string, ``name[:key=value[,key=value...]]``
(docs/spec.md). A process group takes it from, in order: ``Options(aggregation=...)``
passed as ``pg_options``, then the ``GRADZIP_AGGREGATION`` environment variable, then
``"allreduce"`` (exact).
"""
import os
from dataclasses import dataclass
from typing import Optional, Union

from .mpi import resolve_transport
from .spec import Spec, bind_spec

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
    cuda_transport: what carries CUDA tensors: ``"nccl"``, ``"host"`` (the CPU transport
        through pinned host memory: ranks that share a GPU, where NCCL refuses them) or
        ``"auto"`` (host exactly when ranks share a GPU, or torch has no NCCL; rank 0 logs
        the choice: gradzip/cuda_transport.py). Default: ``$GRADZIP_CUDA_TRANSPORT``, else
        ``"auto"``.
    """

    aggregation: Union[str, Spec, None] = None
    validate: Optional[bool] = None
    transport: Optional[str] = None
    cuda_transport: Optional[str] = None

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
