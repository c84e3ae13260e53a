"""Byte accounting per gradzip process group.

stats(group) returns, for the all_reduce calls of that group since the last reset (and
its reduce_scatter_tensor calls, when its spec has reduce_scatter=compressed):
    calls           number of those calls
    bytes_sent      bytes this rank sent
    bytes_received  bytes this rank received
    dense_bytes     bytes this rank would have sent with a dense fp32 ring
The exact aggregation ("allreduce") counts what a ring all-reduce of the tensor sends,
2·(P−1)/P of its bytes: the transport's own algorithm is not observable from gradzip.
"""
import torch
import torch.distributed as dist

from ._extension import _C


def _backend(group, door: str = "gradzip.stats"):
    """The gradzip backend of `group` (default: the default group); errors name `door`."""
    if not dist.is_initialized():
        raise RuntimeError(f"{door}: torch.distributed is not initialized")
    group = group if group is not None else dist.group.WORLD
    backend = group._get_backend(torch.device("cpu"))
    if not isinstance(backend, _C.Backend):
        raise ValueError(f"{door}: the group's backend is {dist.get_backend(group)!r}, not 'gradzip'")
    return backend


def stats(group=None) -> dict:
    """The byte counters of `group` (default: the default group), as a dict."""
    return _backend(group).stats()


def set_loss_scale(scale: float, group=None) -> None:
    """The loss scale (torch.amp.GradScaler's get_scale()) that the next all_reduces of
    `group` (a gradzip group; default: the default group) carry: error feedback rescales
    its residuals when it changes (docs/spec.md, "Loss scaling"). Waits for the queued
    all_reduces first; call it after scaler.update()."""
    _backend(group).set_loss_scale(float(scale))


def reset_stats(group=None) -> None:
    """Sets the byte counters of `group` (default: the default group) to zero."""
    _backend(group).reset_stats()
