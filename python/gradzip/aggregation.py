"""Aggregating a whole model, or tensors, by hand (in the spirit of mlbench).

    agg = gradzip.Aggregation("topk:density=0.01")
    loss.backward(); agg(model, op="avg", mode="grad"); opt.step()   # gradients
    agg(model, op="avg", mode="model")                              # parameters themselves

Decentralized training (D-PSGD, CHOCO-SGD): no DDP; each rank steps on its own data, then
averages its parameters with its neighbours (the mode defaults to "model" for gossip specs):

    gossip = gradzip.Aggregation("gossip:topology=exp")       # or "choco:...,gamma=..."
    loss.backward(); opt.step(); gossip(model)

Each parameter is one logical tensor, keyed by its name, so error feedback (and CHOCO's
public copies) follow it exactly. op "avg" and "sum" use the spec's aggregation; "min"
and "max" are exact.
"""
from typing import Iterable, Optional, Union

import torch
import torch.distributed as dist

from ._extension import _C
from .checkpoint import aggregation_state
from ._transport import transport_of, use_node_levels
from .spec import bind_spec
from .rank_agreement import require_same_start
from .world_portable import counters_digest, require_same_world, state_for_world
_OPS = {"avg": dist.ReduceOp.AVG, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


class Aggregation:
    """An aggregation named by a spec (docs/spec.md) over a process group (default: the
    default group), applied to a model's gradients or parameters, or to tensors."""

    def __init__(self, spec, group=None):
        self.spec = bind_spec(spec)  # a string or a gradzip.Spec
        self.group = group
        self._aggregation = _C.Aggregation(self.spec)
        self.decentralized = self.spec.decentralized
        self._node_levels_asked = False  # the hierarchical exchange's groups, made at the first call
        self._agree = True  # the ranks check that they run the same spec from the same point at the next call

    def __call__(self, target: Union[torch.nn.Module, torch.Tensor, Iterable[torch.Tensor], dict], op: str = "avg",
                 mode: Optional[str] = None, buffers: bool = False):
        """Reduces in place and returns `target`.

        target: a module, a tensor, a list of tensors (keyed by position) or a dict of
            tensors (keyed by name).
        op: "avg", "sum", "min" or "max".
        mode: for a module, "grad" (each parameter's .grad; None skipped) or "model"
            (the parameters themselves). Default: "model" for gossip and choco, else "grad".
        buffers: with mode "model", also the module's floating buffers (BatchNorm statistics)."""
        if op not in _OPS:
            raise ValueError(f"gradzip.Aggregation: op must be one of {', '.join(_OPS)}, not {op!r}")
        if mode is None:
            mode = "model" if self.decentralized else "grad"
        if isinstance(target, torch.nn.Module):
            if mode not in ("grad", "model"):
                raise ValueError(f"gradzip.Aggregation: mode must be 'grad' or 'model', not {mode!r}")
            named = [(f"{mode}:{name}", p.grad if mode == "grad" else p.data)
                     for name, p in target.named_parameters()]
            if mode == "model" and buffers:
                named += [(f"buffer:{name}", b) for name, b in target.named_buffers() if b.is_floating_point()]
        elif isinstance(target, torch.Tensor):
            named = [("tensor", target)]
        elif isinstance(target, dict):
            named = [(f"tensor:{name}", t) for name, t in target.items()]
        else:
            named = [(f"tensor:{i}", t) for i, t in enumerate(target)]
        for key, tensor in named:
            if tensor is not None:
                self._reduce(tensor, key, _OPS[op])
        return target

    def _reduce(self, tensor: torch.Tensor, key: str, op) -> None:
        transport = transport_of(self.group, tensor.device)
        if self._agree:  # every rank is in its first call, or its first after a load: a collective point
            self._agree = False
            require_same_start(transport, dist.get_world_size(self.group), self.spec,
                               f"counters {counters_digest(self._aggregation.state_dict())}", tensor.device)
        if not self._node_levels_asked:
            self._node_levels_asked = True
            use_node_levels(self._aggregation, self.spec, self.group, transport, tensor.device)
        if tensor.is_contiguous():
            self._aggregation.allreduce(tensor, key, op, transport)
        else:
            flat = tensor.contiguous()
            self._aggregation.allreduce(flat, key, op, transport)
            tensor.copy_(flat)

    def set_loss_scale(self, scale: float) -> None:
        """The loss scale (torch.amp.GradScaler's get_scale()) that the next calls' inputs
        carry: error feedback rescales its residuals when it changes, so they keep their
        weight against the gradients (docs/spec.md, "Loss scaling")."""
        self._aggregation.set_loss_scale(float(scale))

    def stats(self) -> dict:
        return self._aggregation.stats()

    def reset_stats(self) -> None:
        self._aggregation.reset_stats()

    def state_dict(self, portable: bool = False) -> dict:
        """The spec's text and the state as named tensors ("<key>/<field>"), for this rank of
        this world size. portable=True: a collective over the group giving every rank the
        same dict, loadable at any world size (gradzip.world_portable)."""
        return state_for_world({"spec": str(self.spec)}, "tensors", self._aggregation.state_dict(), self.group,
                               "gradzip.Aggregation", portable)

    def load_state_dict(self, state: dict) -> None:
        """Reads a state_dict() of this build or of an earlier one (gradzip.checkpoint)."""
        state = aggregation_state(state)
        require_same_world(state, self.group, "gradzip.Aggregation")
        if bind_spec(state["spec"]) != self.spec:
            raise ValueError(f"gradzip.Aggregation: the saved state is for {state['spec']!r}, not {str(self.spec)!r}")
        self._aggregation.load_state_dict(state["tensors"])
        self._agree = True


def exchange_plan(spec, numel: int, world_size: int, element_size: int = 4, link_shared_by: int = 1) -> dict:
    """How a compressed all-reduce of `numel` elements (of `element_size` bytes) over
    `world_size` ranks moves: the bytes one rank sends by the transport's ring all-reduce
    ("dense") and by each exchange scheme (under its name, as the spec's `exchange` key
    takes it: "oneshot", "twophase"), the one the spec's `exchange` key picks ("choice";
    auto takes the fewest bytes, dense unless compression sends fewer), the rounds of
    two-phase ("rounds") and of one-shot ("oneshot_rounds"). These are the bytes gradzip.stats() counts for such a
    call. `link_shared_by`: how many such exchanges share each rank's link (a
    hierarchical exchange's lane: the ranks per node), which sets the automatic rounds."""
    return _C.exchange_plan(bind_spec(spec), numel, world_size, element_size, link_shared_by)
