"""DiLoCo: local steps, then a compressed outer step (Douillard et al., 2023).

    outer = gradzip.diloco.DiLoCo(model, "qsgd:bits=4,norm=max,ef=1", local_steps=20)
    for batch in data:
        loss(model, batch).backward(); inner.step(); inner.zero_grad()
        outer.step()          # every local_steps calls: the outer step

Each rank trains its own replica with its own (inner) optimizer, with no communication.
Every `local_steps` steps, every rank computes its pseudo-gradient θ_start − θ, the ranks
average it with the spec's aggregation (compressed, with error feedback when the spec
has it; keyed by parameter name), and an outer SGD step with Nesterov momentum moves
θ_start along the average. All ranks end the outer step with bitwise-identical
parameters. Floating buffers (BatchNorm statistics) are averaged exactly at each outer
step. When the averaged pseudo-gradient holds Inf or NaN (a rank diverged), the outer
step is skipped: every rank's parameters go back to θ_start, the outer momentum is
unchanged and the buffers are not averaged (each rank keeps its own).

state_dict() holds what a resumed job needs besides the model and the inner optimizer:
θ_start, the outer optimizer, the step counter and the aggregation's error feedback;
state_dict(portable=True) resumes at any world size (gradzip.world_portable).
"""
import copy
import warnings

import torch

from .aggregation import Aggregation
from .checkpoint import format_1_state, stamped


class DiLoCo:
    """The outer loop of DiLoCo over a process group.

    model: this rank's replica (no DDP); its parameters must start equal on every rank.
    spec: how pseudo-gradients are averaged (default "allreduce": exact), e.g.
        "qsgd:bits=4,norm=max,ef=1", "qsgd:bits=8", "sign" (docs/spec.md, "DiLoCo").
    local_steps: inner steps between outer steps, H (default 20).
    outer_lr: the outer step's learning rate (default 0.7, DiLoCo's).
    outer_momentum: its Nesterov momentum (default 0.9).
    group: the process group (default None: the default group).
    """

    def __init__(self, model: torch.nn.Module, spec="allreduce", local_steps: int = 20, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, group=None):
        if local_steps < 1:
            raise ValueError(f"gradzip.diloco: local_steps must be >= 1, not {local_steps}")
        self.aggregation = Aggregation(spec, group)
        if self.aggregation.decentralized:
            raise ValueError(f"gradzip.diloco: {self.aggregation.spec.name!r} is decentralized gossip; DiLoCo's "
                             "outer step needs the global average")
        self.local_steps = local_steps
        self.steps = 0
        self._params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self._buffers = [b for _, b in model.named_buffers() if b.is_floating_point()]
        self._start = [p.detach().clone() for _, p in self._params]
        self._exact = Aggregation("allreduce", group)
        self.outer_optimizer = torch.optim.SGD([p for _, p in self._params], lr=outer_lr,
                                               momentum=outer_momentum, nesterov=True)

    def step(self) -> bool:
        """Counts one inner step (call it after the inner optimizer's step); every
        local_steps calls runs the outer step. Returns True when it did."""
        self.steps += 1
        if self.steps % self.local_steps:
            return False
        return self.outer_step()

    @torch.no_grad()
    def outer_step(self) -> bool:
        """Averages the pseudo-gradients and steps θ_start; False when skipped (non-finite)."""
        deltas = {name: start - p for (name, p), start in zip(self._params, self._start)}
        self.aggregation(deltas, op="avg")
        finite = all(bool(torch.isfinite(d).all()) for d in deltas.values())
        if finite and self._buffers:
            self._exact(self._buffers, op="avg")
        inner_grads = [p.grad for _, p in self._params]
        for (name, p), start in zip(self._params, self._start):
            p.copy_(start)
            p.grad = deltas[name]
        if finite:
            self.outer_optimizer.step()
        else:
            warnings.warn("gradzip.diloco: the averaged pseudo-gradient holds Inf or NaN; outer step skipped, "
                          "every rank restarts from the last outer step's parameters")
        for (_, p), grad, start in zip(self._params, inner_grads, self._start):
            p.grad = grad
            start.copy_(p)
        return finite

    def stats(self) -> dict:
        """Bytes the outer steps sent (gradzip.Aggregation.stats()), buffers included."""
        a, b = self.aggregation.stats(), self._exact.stats()
        return {k: a[k] + b[k] for k in a}

    def state_dict(self, portable: bool = False) -> dict:
        """A snapshot: later steps do not change it (the outer optimizer's state is copied,
        where a torch optimizer's own state_dict() holds its live buffers). θ_start, the outer
        optimizer and the counter are the same on every rank; the aggregation's error feedback
        is this rank's, for this world size. portable=True: a collective over the group giving
        every rank the same dict, loadable at any world size, the error feedback moved by
        gradzip.world_portable's rule (save it right after an outer step, where the model too is
        the same on every rank)."""
        return stamped({"spec": str(self.aggregation.spec), "local_steps": self.local_steps, "steps": self.steps,
                        "start": {name: t.clone() for (name, _), t in zip(self._params, self._start)},
                        "outer_optimizer": copy.deepcopy(self.outer_optimizer.state_dict()),
                        "aggregation": self.aggregation.state_dict(portable=portable)})

    def load_state_dict(self, state: dict) -> None:
        """Reads a state_dict() of this build or of an earlier one (gradzip.checkpoint)."""
        state = format_1_state(state, "gradzip.diloco",
                               ("spec", "local_steps", "steps", "start", "outer_optimizer", "aggregation"))
        if state["spec"] != str(self.aggregation.spec):
            raise ValueError(f"gradzip.diloco: the saved state is for {state['spec']!r}, this DiLoCo runs "
                             f"{str(self.aggregation.spec)!r}")
        names = [name for name, _ in self._params]
        if sorted(state["start"]) != sorted(names):
            raise ValueError("gradzip.diloco: the saved state is for a model with other parameters")
        self.aggregation.load_state_dict(state["aggregation"])
        self.local_steps, self.steps = state["local_steps"], state["steps"]
        for name, start in zip(names, self._start):
            start.copy_(state["start"][name])
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
