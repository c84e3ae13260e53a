"""Checkpoints that move between world sizes: the rule, written once, for every door.

A rank's state_dict() holds that rank's error feedback for one world size and one rank
numbering, and says so ("world_size", "rank"): loading it into another rank, or at another
world size, raises instead of resuming with the wrong rank's residuals.

state_dict(portable=True) is a collective (every rank of the group calls it) that returns the
same dict on every rank, loadable by any rank of a job of any size (so torch.save from one
rank, or torch.distributed.checkpoint, which stores a tensor that every rank holds alike
once). The rule, for an average over W ranks, whose update applies (1/W)·Σ_r sent_r:

- residual e_r (the mass not yet sent): every rank's becomes the mean (1/W)·Σ_r e_r, summed in
  float64. A job restarted at W' ranks gives every rank that mean, so the mass not yet applied,
  (1/W')·Σ e' = (1/W)·Σ_r e_r, is conserved: exactly up to one float32 rounding of the mean.
- velocity u_r (momentum correction): the mean as well, so the velocity the average carries,
  (1/W)·Σ_r u_r, follows its parameters across the restart.
- counters (calls, step), a layer's chosen level and the loss scale agree across ranks: kept.
- the two-phase owners' residuals (owner_residual, owner_offset: each owns a chunk whose bounds
  move with the world size) and gossip's public copies (public_copy_<rank>: the neighbours
  change) have no such rule: they are dropped, with a warning that names them and the mass
  (L1 norm) of the owners' residuals dropped.

torch.distributed.checkpoint loads into a destination of the right shapes, which a job at
another world size does not hold before its first step: dcp_destination() makes it from
the checkpoint's own metadata.
"""
import warnings
import zlib

import torch
import torch.distributed as dist

from ._transport import drain, size_and_rank, transport_of
from .checkpoint import CheckpointError, stamped

# A rank's own mass not yet applied, by field of "<key>/<field>".
MASS_FIELDS = ("residual", "velocity")
# The two-phase owners' state: bound to the world size its chunks were cut for.
WORLD_BOUND_FIELDS = ("owner_residual", "owner_offset")
# What every rank of a job in step holds alike: the calls and steps of each key, its chosen
# level and its loss scale.
COUNTER_FIELDS = ("calls", "step", "level", "loss_scale")


def field_of(name: str) -> str:
    """The field of a state name "<key>/<field>"."""
    return name.rsplit("/", 1)[-1]


def l1_mass(tensors: dict, fields) -> float:
    """The L1 norm of the state tensors whose field is one of `fields`."""
    return sum(float(value.abs().sum()) for name, value in tensors.items() if field_of(name) in fields)


def counters_digest(tensors: dict) -> str:
    """A digest of the counters among `tensors` (one rank's "<key>/<field>" state): the same on
    every rank of a job in step, whatever each rank's residuals; "none" for an empty state.
    Ranks that resumed from checkpoints of different steps differ here."""
    counters = sorted((name, value) for name, value in tensors.items() if field_of(name) in COUNTER_FIELDS)
    if not counters:
        return "none"
    digest = 0
    for name, value in counters:
        digest = zlib.crc32(name.encode() + value.detach().to("cpu", torch.float64).numpy().tobytes(), digest)
    return f"{digest:08x} over {len(counters)} counters"


def whose(group) -> dict:
    """The "world_size" and "rank" a rank's own state_dict() is stamped with."""
    if group is None and not dist.is_initialized():
        return {}
    size, rank = size_and_rank(group)
    return {"world_size": size, "rank": rank}


def state_for_world(state: dict, field: str, tensors: dict, group, door: str, portable: bool) -> dict:
    """A door's state_dict(): `state` with its named `tensors` under `field`, stamped with this
    rank and world size, or made portable (a collective) when `portable`."""
    if portable:
        return stamped({**state, field: portable_tensors(tensors, group, door), "portable": True})
    return stamped({**state, field: tensors, **whose(group)})


def portable_tensors(tensors: dict, group, door: str) -> dict:
    """Collective over `group`: `tensors` (one rank's "<key>/<field>" state) under the rule
    above, the same on every rank. Every rank must hold the same names."""
    world, rank = size_and_rank(group)
    try:
        return _portable_tensors(tensors, group, door, world)
    except CheckpointError:
        raise
    except RuntimeError as error:  # a rank lost (or gone astray) inside the collective
        raise CheckpointError(f"{door}: state_dict(portable=True) is a collective over the group's {world} ranks, "
                              f"and it failed on rank {rank}, so no state was returned: {error}") from error


def _portable_tensors(tensors: dict, group, door: str, world: int) -> dict:
    dropped = sorted(name for name in tensors
                     if field_of(name) in WORLD_BOUND_FIELDS or field_of(name).startswith("public_copy_"))
    averaged = sorted(name for name in tensors if field_of(name) in MASS_FIELDS)
    drain(group, torch.device("cpu"))
    transport = transport_of(group, torch.device("cpu"))
    layout = ";".join(f"{n}:{tensors[n].numel()}" for n in averaged).encode()
    _require_same_layout(transport, [len(averaged), zlib.crc32(layout)], door)
    flat = torch.cat([tensors[n].detach().to("cpu", torch.float64).view(-1) for n in averaged] +
                     [torch.zeros(1, dtype=torch.float64)])  # the last: the owners' dropped mass
    flat[-1] = l1_mass(tensors, ("owner_residual",))
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.SUM
    transport.allreduce([flat], options).wait()
    out, offset = {}, 0
    for name in sorted(tensors):
        if name in averaged:
            value = tensors[name]
            out[name] = (flat[offset: offset + value.numel()] / world).to(value.dtype).view_as(value)
            offset += value.numel()
        elif name not in dropped:
            out[name] = tensors[name].detach().clone()
    if dropped:
        warnings.warn(f"{door}: state_dict(portable=True) drops what has no rule across world sizes "
                      f"({', '.join(dropped)}; the owners' residuals held an L1 mass of {float(flat[-1]):.6g} "
                      "summed over the ranks)", RuntimeWarning, stacklevel=4)
    return out


def _require_same_layout(transport, mine: list, door: str) -> None:
    """Every rank averages the same names and sizes (else the sum below would mismatch): one
    MAX of the values and their negations gives the largest and the smallest of each."""
    both = torch.tensor(mine + [-v for v in mine], dtype=torch.int64)
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MAX
    transport.allreduce([both], options).wait()
    largest, smallest = both[:len(mine)], -both[len(mine):]
    if not torch.equal(largest, smallest):
        raise CheckpointError(f"{door}: state_dict(portable=True) needs the same state on every rank, and the ranks "
                              "hold different tensors (another spec or model on some rank, or a rank that has "
                              "not aggregated yet)")


def dcp_destination(checkpoint, key: str = "gradzip") -> dict:
    """The destination torch.distributed.checkpoint.load fills with the portable state a job
    saved under `key` (dcp.save({..., key: state.state_dict(portable=True)}, ...)): the
    same nesting, an empty tensor of the saved shape and dtype in place of each tensor, the
    saved values in place of the rest. `checkpoint`: the checkpoint's directory, or a
    dcp.StorageReader. Needs the metadata of DCP's default planner (flatten_state_dict, the
    default), which records each value's place in the nesting.

        sd = {"model": model.state_dict(), "gradzip": gradzip.world_portable.dcp_destination(path)}
        dcp.load(sd, checkpoint_id=path)
        model.load_state_dict(sd["model"]); state.load_state_dict(sd["gradzip"])
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = checkpoint if isinstance(checkpoint, dcp.StorageReader) else dcp.FileSystemReader(str(checkpoint))
    metadata = reader.read_metadata()
    places = metadata.planner_data
    if not isinstance(places, dict):
        raise CheckpointError("gradzip.world_portable.dcp_destination: this checkpoint's metadata does not record "
                              "where each value sits in the saved dict (saved by a planner that does not flatten "
                              "it); load it with the destination the planner expects")
    out = {}
    for fqn, storage in metadata.state_dict_metadata.items():
        path = places.get(fqn, (fqn,))
        if not path or path[0] != key:
            continue
        if not isinstance(storage, TensorStorageMetadata):
            value = None  # filled by dcp.load with the saved object
        else:
            value = torch.empty(tuple(storage.size), dtype=storage.properties.dtype)
        node = out
        for step in path[1:-1]:
            node = node.setdefault(step, {})
        if len(path) == 1:
            raise CheckpointError(f"gradzip.world_portable.dcp_destination: {key!r} is a single value in this "
                                  "checkpoint, not a state_dict")
        node[path[-1]] = value
    if not out:
        raise CheckpointError(f"gradzip.world_portable.dcp_destination: this checkpoint holds nothing under {key!r} "
                              f"(its top-level keys: {sorted({places.get(f, (f,))[0] for f in places})})")
    return out


def require_same_world(state: dict, group, door: str) -> None:
    """Refuses a rank's own (not portable) state_dict() at another world size or rank."""
    here = whose(group)
    if state.get("portable") or "world_size" not in state or not here:
        return
    if (state["world_size"], state["rank"]) != (here["world_size"], here["rank"]):
        raise CheckpointError(
            f"{door}: this checkpoint holds the error feedback of rank {state['rank']} of {state['world_size']}, "
            f"and this is rank {here['rank']} of {here['world_size']}: a rank's own state resumes only there; "
            "save with state_dict(portable=True) to move between world sizes")
