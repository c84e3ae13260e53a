"""The transport that carries a process group's tensors for gradzip's own aggregations."""
import torch
import torch.distributed as dist

from ._extension import _C


def _backend(group, device: torch.device):
    """The c10d backend of `group` (None: the default group) for `device` tensors."""
    group = group if group is not None else dist.group.WORLD
    return group._get_backend(torch.device(device.type))


def size_and_rank(group) -> tuple:
    """(size, rank) of this rank in `group` (None: the default group). A group object is asked
    itself, so that groups torch.distributed did not make with new_group (torchft's per-quorum
    groups, which it does not register) work alike."""
    if group is None:
        return dist.get_world_size(), dist.get_rank()
    return group.size(), group.rank()


def drain(group, device: torch.device):
    """Waits for the all-reduces queued on a gradzip group's worker (nothing for other
    groups), so that a caller about to use its inner transport directly cannot overtake
    them."""
    backend = _backend(group, device)
    if isinstance(backend, _C.Backend):
        backend.drain()


def use_node_levels(aggregation, spec, group, transport, device: torch.device) -> None:
    """Gives a door's own aggregation (a _C.Aggregation) the hierarchical exchange's node
    and lane groups for `transport` when its spec uses them and the group's ranks sit in
    several nodes (CPU tensors; CUDA ones stay flat at these doors): MPI sub-communicators
    when `transport` is the MPI transport, else Gloo groups. Collective over `group`: every
    rank calls it at the same point."""
    from .node_layout import group_node_levels, shared_memory_wanted
    if not spec.uses_node_levels or device.type != "cpu":
        return
    if hasattr(_C, "MpiBackend") and isinstance(transport, _C.MpiBackend):
        from .mpi import node_levels
        group = group if group is not None else dist.group.WORLD
        size = dist.get_world_size(group)
        levels = node_levels(transport, dist.get_rank(group), size,
                             [dist.get_global_rank(group, r) for r in range(size)], transport.timeout)
    else:
        levels = group_node_levels(group)
    if levels is not None:
        node, lane, ranks, name = levels
        aggregation.use_node_levels(transport, node, lane, ranks, shared_memory=name if shared_memory_wanted() else None)


def transport_of(group, device: torch.device):
    """The c10d backend that moves `device` tensors for `group`. For a gradzip group,
    its inner Gloo or NCCL backend: aggregating through the gradzip backend itself
    would apply its configured aggregation a second time."""
    backend = _backend(group, device)
    if isinstance(backend, _C.Backend):
        inner = backend.transport(device.type)
        if inner is None:
            raise RuntimeError(f"gradzip: this gradzip group has no transport for {device.type} tensors")
        return inner
    return backend
