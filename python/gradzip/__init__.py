"""gradzip: compressed gradient aggregation for torch.distributed.

``import gradzip`` registers the torch.distributed backend ``"gradzip"`` (devices cpu
and cuda). Its ``all_reduce`` runs the configured aggregation; every other collective
is forwarded, exactly, to Gloo or MPI (CPU tensors; gradzip.mpi) or NCCL (CUDA tensors; where
ranks share a GPU, Gloo or MPI through pinned host memory: gradzip.cuda_transport). The same
aggregations serve a DDP comm hook (gradzip.hooks), whole models (gradzip.Aggregation,
also for decentralized gossip over a gradzip.Topology) and code that moves bytes itself
(gradzip.codec).

    import gradzip, torch.distributed as dist
    gradzip.init_process_group("gradzip", pg_options=gradzip.Options(aggregation="allreduce"))
"""
import atexit

import torch
import torch.distributed  # before _C: pybind11 must know c10d.Backend first

from ._extension import _C
from .launch import init_process_group, launch_environment
from .options import Options
from .spec import Spec, SpecError, aggregations, canonical_spec
from .backend import register
from .stats import reset_stats, set_loss_scale, stats
from .group_state import load_state_dict, state_dict
from .momentum_folding import fold_momentum
from . import checkpoint, codec, diloco, hooks, mpi
from .aggregation import Aggregation, exchange_plan
from .topology import Topology
from .codec import PayloadError

__version__ = "0.1.0"


def build_info() -> dict:
    """What this build is: the torch it was built against ("torch", and "torch_cuda", "" for a
    CPU-only torch), whether its CUDA kernels and MPI transport were built, and which optional
    system libraries it uses (a missing one turns off only what needs it: the zfp codec, the
    lossless stages zstd and blosc)."""
    import json
    from pathlib import Path

    built = json.loads(Path(__file__).with_name("_build.json").read_text())
    return {**built, "cuda_kernels": _C.cuda_built(), "cuda_architectures": _C.cuda_architectures(),
            "mpi": _C.mpi_built(), "system_libraries": _C.system_libraries()}


def cuda_built() -> bool:
    """True when gradzip's CUDA kernels were compiled into this build (a GPU need not be present)."""
    return _C.cuda_built()


def cuda_architectures() -> list:
    """The GPU compute capabilities the kernels were compiled for, e.g. [80, 90]; [] without CUDA."""
    return _C.cuda_architectures()


def __getattr__(name):
    # gradzip.fsdp imports FSDP and DTensor (about a second, a third of `import gradzip`):
    # only on first use. gradzip.torchft imports torchft, an optional dependency.
    if name in ("fsdp", "torchft"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'gradzip' has no attribute '{name}'")


register()
# Before Python finalizes, gradzip's threads finish the completions they are in (a future's
# callbacks, freeing a call's tensors) and start no more: one that took the GIL during
# finalization would abort the process (csrc/work/exit_gate.h). Registered at import, it
# runs after the handlers registered later, the application's among them.
atexit.register(_C._close_exit_gate)

__all__ = [
    "Aggregation", "Options", "PayloadError", "Spec", "SpecError", "Topology", "aggregations", "build_info",
    "canonical_spec", "checkpoint",
    "codec",
    "cuda_architectures", "cuda_built", "diloco", "exchange_plan", "fold_momentum", "fsdp", "hooks", "init_process_group", "launch_environment", "load_state_dict", "mpi",
    "register", "reset_stats", "set_loss_scale", "state_dict", "stats",
]
