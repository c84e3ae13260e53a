"""The MPI transport: gradzip's CPU collectives over MPI (Open MPI or MPICH) instead of Gloo.

Under the launcher of the MPI the build links (Open MPI's mpirun, MPICH's mpiexec),
``gradzip.init_process_group()`` picks it by itself: no MASTER_ADDR, no TCP store.
``Options(transport="mpi"|"gloo")`` or ``GRADZIP_TRANSPORT`` chooses explicitly. A job
started by the other MPI's launcher runs over Gloo, and asking it for MPI is refused:
one MPI cannot join another's job. CUDA tensors stay on NCCL, which rendezvouses
through a TCP store whose address rank 0 broadcasts over MPI.
csrc/transport/mpi/mpi_backend.h states what the transport guarantees (rank-ordered
reductions, bitwise identical on every rank; timeouts).
"""
import atexit
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from ._extension import _C
from .node_layout import (forced_layout, layout_of, layout_ranks, new_shared_memory_name, node_identity,
                          node_transports)

TRANSPORTS = ("mpi", "gloo")
_finish_registered = False


def mpi_built() -> bool:
    """True when this build of gradzip contains the MPI transport (CMake found MPI)."""
    return _C.mpi_built()


# MPI family -> the variables its launcher gives each process: (rank, world size).
# Intel MPI is an MPICH: its mpirun sets MPICH's variables.
LAUNCHER_VARIABLES = {
    "Open MPI": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    "MPICH": ("PMI_RANK", "PMI_SIZE"),
}
_LAUNCHER_NAMES = {"Open MPI": "Open MPI's mpirun", "MPICH": "MPICH's mpiexec (Hydra)"}


def mpi_library() -> str:
    """The MPI library this build's transport links (MPI_Get_library_version's text), or ""
    when the build has no MPI transport."""
    return _C.mpi_library()


def library_family(library: str):
    """ "Open MPI" or "MPICH" for an MPI_Get_library_version text; None when neither."""
    if library.startswith("Open MPI"):
        return "Open MPI"
    if "MPICH" in library or library.startswith("Intel(R) MPI"):
        return "MPICH"
    return None


def launcher_family(environ=None):
    """The MPI family whose launcher started this process ("Open MPI", "MPICH"), from its
    variables; None when no MPI launcher did."""
    env = os.environ if environ is None else environ
    for family, (rank, size) in LAUNCHER_VARIABLES.items():
        if rank in env and size in env:
            return family
    return None


def launched_by_mpirun(environ=None, library=None) -> bool:
    """True when the launcher of the MPI this build links started this process (Open MPI's
    mpirun: OMPI_COMM_WORLD_*; MPICH's mpiexec: PMI_RANK, PMI_SIZE)."""
    built = library_family(mpi_library() if library is None else library)
    return built is not None and launcher_family(environ) == built


def resolve_transport(requested=None, environ=None, library=None) -> str:
    """The CPU transport of a gradzip group: `requested`, else $GRADZIP_TRANSPORT, else
    "mpi" when the launcher of the MPI this build links started the job, else "gloo".
    `library`: the build's MPI (default mpi_library(); tests pass another)."""
    env = os.environ if environ is None else environ
    library = mpi_library() if library is None else library
    value = requested if requested is not None else env.get("GRADZIP_TRANSPORT")
    if value is None:
        return "mpi" if launched_by_mpirun(env, library) else "gloo"
    value = str(value).strip().lower()
    if value not in TRANSPORTS:
        raise ValueError(f"gradzip: the transport must be one of {', '.join(TRANSPORTS)}, not {value!r}")
    if value == "mpi":
        if not library:
            raise RuntimeError(
                "gradzip: transport=mpi, but this build has no MPI transport: install Open MPI "
                "(Debian: libopenmpi-dev) or MPICH (libmpich-dev) and rebuild gradzip"
            )
        built, launcher = library_family(library), launcher_family(env)
        if launcher is not None and launcher != built:
            raise RuntimeError(
                f"gradzip: transport=mpi, but this job was started by {_LAUNCHER_NAMES[launcher]} and this "
                f"build's MPI transport links another MPI ({library.splitlines()[0].strip()}); one MPI cannot "
                f"join another's job. Rebuild gradzip against {launcher} (for MPICH: "
                "cmake -DMPI_CXX_COMPILER=mpicxx.mpich, or make it the system's mpi alternative), launch with "
                "the build's own mpirun, or use transport=gloo"
            )
    return value


def world_from_mpirun(environ=None, library=None):
    """(rank, world size) from the variables of the launcher of the MPI this build links."""
    env = os.environ if environ is None else environ
    family = library_family(mpi_library() if library is None else library)
    if not launched_by_mpirun(env, library):
        names = " and ".join(LAUNCHER_VARIABLES.get(family, LAUNCHER_VARIABLES["Open MPI"]))
        raise RuntimeError(
            "gradzip: the MPI transport without a store needs a job started by "
            f"{_LAUNCHER_NAMES.get(family, 'mpirun')} ({names} are not set)"
        )
    rank, size = LAUNCHER_VARIABLES[family]
    return int(env[rank]), int(env[size])


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
    server = None
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        server = dist.TCPStore(host, 0, size, True, timeout, wait_for_workers=False)
    address = _fixed_bytes(f"{host}:{server.port}" if rank == 0 else "")
    transport.broadcast([address], dist.BroadcastOptions()).wait()
    if rank == 0:
        return server
    host, port = _text(address).rsplit(":", 1)
    return dist.TCPStore(host, int(port), size, False, timeout)


def _fixed_bytes(text: str, width: int = 256) -> torch.Tensor:
    data = text.encode()
    if len(data) > width:
        raise ValueError(f"gradzip: {text!r} is longer than {width} bytes")
    out = torch.zeros(width, dtype=torch.uint8)
    out[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    return out


def _text(row: torch.Tensor) -> str:
    return bytes(row[row != 0].tolist()).decode()


def node_levels(transport, rank: int, size: int, global_ranks, timeout: timedelta):
    """(node, lane, ranks, shared-memory name) for this rank of a group over the MPI
    `transport`: the hierarchical exchange's levels as MPI sub-communicators, or None where
    the layout has no hierarchy to use. Collective over the group: node identities are
    all-gathered over MPI (no store), each rank joins its node's and its lane's
    communicators, and the node's first rank names its shared memory."""

    layout = forced_layout(size)
    if layout is None:
        every = torch.zeros(256 * size, dtype=torch.uint8)
        transport._allgather_base(every, _fixed_bytes(node_identity()), AllgatherOptions()).wait()
        layout = layout_of([_text(every[256 * r: 256 * (r + 1)]) for r in range(size)])
    world = list(global_ranks) if global_ranks else list(range(size))
    levels = node_transports(layout, rank, lambda _name, members, index: create_transport(
        index, len(members), [world[m] for m in members], timeout))
    if levels is None:
        return None
    node, lane = levels
    first = next(ranks for ranks in layout if rank in ranks)[0] == rank
    name = _fixed_bytes(new_shared_memory_name() if first else "")
    node.broadcast([name], dist.BroadcastOptions()).wait()
    return node, lane, layout_ranks(layout), _text(name)
