"""The MPI transport: gradzip's CPU collectives over Open MPI instead of Gloo.

Under mpirun, ``gradzip.init_process_group()`` picks it by itself: no MASTER_ADDR, no
TCP store. ``Options(transport="mpi"|"gloo")`` or ``GRADZIP_TRANSPORT`` chooses
explicitly. CUDA tensors stay on NCCL, which rendezvouses through a TCP store whose
address rank 0 broadcasts over MPI. csrc/transport/mpi/mpi_backend.h states what the transport
guarantees (rank-ordered reductions, bitwise identical on every rank; timeouts).
"""
import atexit
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from ._extension import _C

TRANSPORTS = ("mpi", "gloo")
_finish_registered = False


def mpi_built() -> bool:
    """True when this build of gradzip contains the MPI transport (CMake found MPI)."""
    return _C.mpi_built()


def launched_by_mpirun(environ=None) -> bool:
    """True when Open MPI's mpirun started this process (OMPI_COMM_WORLD_* are set)."""
    env = os.environ if environ is None else environ
    return "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env


def resolve_transport(requested=None, environ=None) -> str:
    """The CPU transport of a gradzip group: `requested`, else $GRADZIP_TRANSPORT, else
    "mpi" under Open MPI's mpirun when the MPI transport is built, else "gloo"."""
    env = os.environ if environ is None else environ
    value = requested if requested is not None else env.get("GRADZIP_TRANSPORT")
    if value is None:
        return "mpi" if launched_by_mpirun(env) and mpi_built() else "gloo"
    value = str(value).strip().lower()
    if value not in TRANSPORTS:
        raise ValueError(f"gradzip: the transport must be one of {', '.join(TRANSPORTS)}, not {value!r}")
    if value == "mpi" and not mpi_built():
        raise RuntimeError(
            "gradzip: transport=mpi, but this build has no MPI transport: install Open MPI "
            "(Debian: libopenmpi-dev) and rebuild gradzip"
        )
    return value


def world_from_mpirun(environ=None):
    """(rank, world size) from Open MPI's variables."""
    env = os.environ if environ is None else environ
    if not launched_by_mpirun(env):
        raise RuntimeError(
            "gradzip: the MPI transport without a store needs a job launched by Open MPI's mpirun "
            "(OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE are not set)"
        )
    return int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"])


def create_transport(rank: int, size: int, global_ranks, timeout: timedelta):
    """A gradzip._C.MpiBackend for a group; MPI is finalized at interpreter exit."""
    global _finish_registered
    backend = _C.MpiBackend(rank, size, list(global_ranks or []), timeout)
    if not _finish_registered:
        # Registered after MPI started (and after mpi4py's own handler, when it is used),
        # so it runs first: communicators are released before MPI_Finalize.
        atexit.register(_C.mpi_finish)
        _finish_registered = True
    return backend


def rendezvous_store(transport, rank: int, size: int, timeout: timedelta):
    """A TCP store for NCCL's rendezvous, found over MPI: rank 0 listens on a free port of
    its host and broadcasts the address through `transport`."""
    address = torch.zeros(256, dtype=torch.uint8)
    server = None
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        server = dist.TCPStore(host, 0, size, True, timeout, wait_for_workers=False)
        text = f"{host}:{server.port}".encode()
        address[: len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    transport.broadcast([address], dist.BroadcastOptions()).wait()
    if rank == 0:
        return server
    host, port = bytes(address[address != 0].tolist()).decode().rsplit(":", 1)
    return dist.TCPStore(host, int(port), size, False, timeout)
