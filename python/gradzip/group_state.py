"""The state of a gradzip process group (the backend door), for checkpoints.

    torch.save(gradzip.state_dict(), "gradzip.pt")         # every rank, after a step
    gradzip.load_state_dict(torch.load("gradzip.pt"))      # a resumed job, same spec

state_dict() waits for the group's queued all_reduces and returns its format
(gradzip.checkpoint), its spec and its aggregation's state as named tensors
("<key>/<field>"; keys as the backend names tensors, docs/spec.md). load_state_dict()
also reads the named tensors alone, as group._get_backend(cpu).state_dict() gave them
before this door existed.
"""
import torch

from .checkpoint import CheckpointError, format_1_state
from .spec import bind_spec
from .stats import _backend
from .world_portable import require_same_world, state_for_world


def state_dict(group=None, portable: bool = False) -> dict:
    """The state of `group` (a gradzip group; default: the default group), for this rank of
    this world size. portable=True: a collective over the group giving every rank the same
    dict, loadable at any world size (gradzip.world_portable)."""
    backend = _backend(group, "gradzip.state_dict")
    return state_for_world({"spec": str(backend.spec)}, "tensors", backend.state_dict(), group, "gradzip.state_dict",
                           portable)


def load_state_dict(state: dict, group=None) -> None:
    """Restores a state_dict() into `group`, whose spec must be the saved one."""
    backend = _backend(group, "gradzip.load_state_dict")
    if isinstance(state, dict) and state and all(isinstance(v, torch.Tensor) for v in state.values()):
        backend.load_state_dict(state)  # format 1's named tensors, saved without a spec
        return
    state = format_1_state(state, "gradzip.load_state_dict", ("spec", "tensors"))
    require_same_world(state, group, "gradzip.load_state_dict")
    if bind_spec(state["spec"]) != bind_spec(str(backend.spec)):
        raise CheckpointError(f"gradzip.load_state_dict: the saved state is for {state['spec']!r}, this group runs "
                              f"{str(backend.spec)!r}")
    backend.load_state_dict(state["tensors"])
