"""The torch.distributed backend "gradzip": its creator and its registration."""
from datetime import timedelta

import torch
import torch.distributed as dist

from . import cuda_transport, mpi
from ._extension import _C
from .node_layout import (gloo_maker, layout_ranks, node_layout, node_transports, shared_memory_name,
                          shared_memory_wanted)
from .options import Options
from .spec import SpecError
from .rank_agreement import describe, gathered_texts, require_same

BACKEND_NAME = "gradzip"


def _create_backend(dist_opts, backend_options):
    """Called by torch.distributed (extended API) once per process group."""
    if backend_options is None:
        options = Options()
    elif isinstance(backend_options, Options):
        options = backend_options
    else:
        raise TypeError(
            f"gradzip: pg_options must be a gradzip.Options, not {type(backend_options).__name__}"
        )
    # A rank whose spec (or CUDA transport) does not parse still joins the all-gather
    # below, so that the others learn why instead of waiting for it.
    invalid = None
    try:
        spec = options.resolved_spec()
        configured = describe(f"spec '{spec}'")
    except SpecError as error:
        invalid, configured = error, describe(f"an invalid spec ({error})")
    try:
        cuda_asked = cuda_transport.requested(options.cuda_transport)
    except ValueError as error:
        invalid = invalid or error
        cuda_asked = f"an invalid request ({error})"
    validate = options.resolved_validate()
    rank, size = dist_opts.group_rank, dist_opts.group_size
    timeout = dist_opts.timeout if isinstance(dist_opts.timeout, timedelta) else timedelta(seconds=1800)

    # Gloo and NCCL rendezvous under their own prefixes of this group's store; over MPI,
    # the communicator needs no store, and NCCL gets one whose address MPI carries.
    store = dist_opts.store
    over_mpi = options.resolved_transport() == "mpi"
    if over_mpi:
        cpu = mpi.create_transport(rank, size, dist_opts.global_ranks_in_group, timeout)
    else:
        cpu = dist.ProcessGroupGloo(dist.PrefixStore("gradzip/gloo/", store), rank, size, timeout)
        cpu.options.global_ranks_in_group = dist_opts.global_ranks_in_group
        cpu.options.group_name = f"{dist_opts.group_id}/gradzip-gloo"  # its logs tell it from a gloo group
    # One all-gather: what each rank was configured with (they must agree), and what
    # decides the CUDA transport (cuda_transport.py).
    bound = bound_device(dist_opts)
    said = gathered_texts(cpu, size, [configured, cuda_transport.describe_rank(cuda_asked, bound)])
    require_same([texts[0] for texts in said])
    cuda_transport.require_one_request([texts[1] for texts in said])
    if invalid is not None:
        raise invalid
    cuda = None
    if torch.cuda.is_available() and cuda_transport.choose(cuda_asked, [texts[1] for texts in said], rank) == "host":
        cuda = _C.HostStagedBackend(cpu)
    elif torch.cuda.is_available():
        if over_mpi:
            store = mpi.rendezvous_store(cpu, rank, size, timeout)
        nccl_options = dist.ProcessGroupNCCL.Options()
        nccl_options._timeout = timeout
        nccl_options.global_ranks_in_group = dist_opts.global_ranks_in_group
        nccl_options.group_name = f"{dist_opts.group_id}/gradzip-nccl"
        cuda = dist.ProcessGroupNCCL(dist.PrefixStore("gradzip/nccl/", store), rank, size, nccl_options)
        # init_process_group(device_id=...) bound the group to this rank's GPU: so is NCCL,
        # whose communicators are then made for that device, never one it guesses.
        if bound is not None:
            cuda.bound_device_id = bound
    backend = _C.Backend(rank, size, cpu, cuda, spec, validate, timeout)
    # The collective check through shared memory where every rank runs on this host.
    if validate and not over_mpi and shared_memory_wanted() and len(node_layout(store, rank, size)) == 1:
        backend.use_shared_memory_check(shared_memory_name(store, [list(range(size))], rank, "check"))
    # The hierarchical exchange's node and lane transports, when the ranks sit in several
    # nodes: MPI sub-communicators over MPI, else Gloo groups under the group's store.
    if spec.uses_node_levels and over_mpi:
        levels = mpi.node_levels(cpu, rank, size, dist_opts.global_ranks_in_group, timeout)
        if levels is not None:
            node, lane, ranks, name = levels
            backend.use_node_levels("cpu", node, lane, ranks, shared_memory=name if shared_memory_wanted() else None)
    elif spec.uses_node_levels:
        layout = node_layout(store, rank, size)
        levels = node_transports(layout, rank, gloo_maker(store, timeout))
        if levels is not None:
            name = shared_memory_name(store, layout, rank) if shared_memory_wanted() else None
            backend.use_node_levels("cpu", *levels, layout_ranks(layout), shared_memory=name)
            if isinstance(cuda, _C.HostStagedBackend):  # the node and lane transports, staged
                backend.use_node_levels("cuda", *(_C.HostStagedBackend(level) for level in levels),
                                        layout_ranks(layout))
            elif cuda is not None:
                backend.use_node_levels("cuda", *node_transports(layout, rank, nccl_maker(store, nccl_options)),
                                        layout_ranks(layout))
    return backend


def nccl_maker(store, options):
    """make() for node_transports: NCCL groups (their communicators made at first use)."""
    def make(name, members, index):
        own = dist.ProcessGroupNCCL.Options()
        own._timeout = options._timeout
        own.group_name = f"{options.group_name}/{name}"
        return dist.ProcessGroupNCCL(dist.PrefixStore(f"gradzip/nccl/{name}/", store), index, len(members), own)
    return make


def bound_device(dist_opts):
    """The CUDA device init_process_group(device_id=...) bound the group to, or None: also
    on torch versions whose backend options carry no process group (before 2.6) or whose
    process groups carry no bound device."""
    group = getattr(dist_opts, "process_group", None)
    bound = getattr(group, "bound_device_id", None) if group is not None else None
    return bound if bound is not None and getattr(bound, "type", None) == "cuda" else None


def bind_transport_to_bound_device(group=None):
    """Binds a gradzip group's NCCL transport to the GPU that init_process_group(device_id=...)
    bound the group to, where the backend could not see it when it was made: torch versions
    whose backend options carry no process group (2.11, the GPU machines' torch, among
    them) set the group's bound device only after the backend exists. A no-op for other
    groups, for groups bound to no GPU, for a transport already bound, and for a group
    whose CUDA tensors travel through host memory."""
    group = group if group is not None else dist.group.WORLD
    bound = getattr(group, "bound_device_id", None)
    if bound is None or bound.type != "cuda" or dist.get_backend(group) != BACKEND_NAME:
        return
    backend = group._get_backend(torch.device("cuda"))
    nccl = backend.transport("cuda") if isinstance(backend, _C.Backend) else None
    if nccl is not None and not isinstance(nccl, _C.HostStagedBackend) and nccl.bound_device_id is None:
        nccl.bound_device_id = bound


def register():
    """Registers the backend name "gradzip" for cpu and cuda; safe to call again."""
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])
