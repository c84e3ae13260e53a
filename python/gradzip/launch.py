"""One script under torchrun, mpirun (Open MPI, MPICH) and SLURM's srun.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Other launchers
set their own variables; launch_environment() fills the torch ones from them, never
overriding a torch variable that is already set.
"""
import os

import torch.distributed as dist

from .backend import bind_transport_to_bound_device
from .mpi import resolve_transport, world_from_mpirun
from .options import Options

DEFAULT_MASTER_PORT = "29500"

# launcher -> (rank, world size, local rank, node count or None)
_LAUNCHERS = {
    "Open MPI (mpirun)": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", None),
    "MPICH / Intel MPI (mpirun)": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", None),
    "SLURM (srun)": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NNODES"),
}


def launch_environment(environ=None) -> dict:
    """Fills RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in `environ`
    (default os.environ) from the launcher's variables; returns the values now set.

    Without MASTER_ADDR, a single-node job rendezvouses on 127.0.0.1; a multi-node
    SLURM job must set MASTER_ADDR itself (it names no host we could trust)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        for launcher, (rank, size, local, nodes) in _LAUNCHERS.items():
            if rank in env and size in env:
                env.setdefault("RANK", env[rank])
                env.setdefault("WORLD_SIZE", env[size])
                env.setdefault("LOCAL_RANK", env.get(local, "0"))
                if "MASTER_ADDR" not in env:
                    if nodes and int(env.get(nodes, "1")) > 1:
                        raise RuntimeError(
                            f"gradzip: a multi-node job under {launcher} needs MASTER_ADDR set to the "
                            "address of the node that runs rank 0"
                        )
                    env["MASTER_ADDR"] = "127.0.0.1"
                break
    env.setdefault("LOCAL_RANK", "0")
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", DEFAULT_MASTER_PORT)
    return {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k in env}


def init_process_group(backend: str = "gradzip", **kwargs):
    """dist.init_process_group after launch_environment(): the same script runs under
    torchrun, mpirun and srun. Keyword arguments go to dist.init_process_group.

    A gradzip group whose transport is MPI (the default under Open MPI's mpirun, see
    gradzip.mpi) and that is given no init_method or store rendezvouses over MPI: the
    ranks come from mpirun, and no MASTER_ADDR or TCP store is needed. Such a job cannot
    create Gloo groups of its own (they need a shared store)."""
    found = launch_environment()
    if backend == "gradzip" and kwargs.get("init_method") is None and "store" not in kwargs:
        options = kwargs.get("pg_options")
        transport = options.transport if isinstance(options, Options) else None
        if resolve_transport(transport) == "mpi":
            rank, size = world_from_mpirun()
            # torch.distributed insists on a store; the MPI transport never uses this one.
            kwargs.update(store=dist.HashStore(), rank=rank, world_size=size)
            dist.init_process_group(backend, **kwargs)
            bind_transport_to_bound_device()
            return
    by_env = kwargs.get("init_method") in (None, "env://") and "store" not in kwargs
    if by_env and ("rank" not in kwargs or "world_size" not in kwargs) and not {"RANK", "WORLD_SIZE"} <= set(found):
        raise RuntimeError(
            "gradzip: cannot tell this process's rank: none of torchrun's (RANK, WORLD_SIZE), Open MPI's "
            "(OMPI_COMM_WORLD_*), MPICH's (PMI_*) or SLURM's (SLURM_PROCID, SLURM_NTASKS) variables are set, "
            "and no rank/world_size was passed"
        )
    dist.init_process_group(backend, **kwargs)
    bind_transport_to_bound_device()
