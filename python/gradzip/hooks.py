"""gradzip as a DDP comm hook, over any process group (nccl, gloo, gradzip).

    state = gradzip.hooks.State("stc:density=0.01")
    ddp.register_comm_hook(state, gradzip.hooks.hook)

Each bucket is aggregated with the spec's aggregation and averaged over the ranks
(DDP does not average when a hook is registered; the hook does). Error feedback is kept
per bucket index. DDP rebuilds its buckets after the first iteration, so the first
`start_iter` iterations go exact and compressed state starts after them. The returned
future holds the bucket's buffer, as PyTorch's own hooks do.
"""
import torch
import torch.distributed as dist

from ._extension import _C
from ._transport import transport_of
from .options import canonical_spec

_DECENTRALIZED = ("gossip", "choco")


class State:
    """State of the gradzip comm hook; every option has a default.

    spec: the aggregation spec, e.g. "stc:density=0.01", "topk:density=0.01",
        "sign", "qsgd:bits=4" (docs/spec.md).
    process_group: the group to aggregate over (default: the default group).
    start_iter: iterations that go exact before compression starts; at least 1,
        because DDP rebuilds its buckets after the first iteration (default 1).
    """

    def __init__(self, spec: str, process_group=None, start_iter: int = 1):
        name = spec.split(":", 1)[0].strip()
        if name in _DECENTRALIZED:
            raise ValueError(
                f"gradzip.hooks: {name!r} is decentralized gossip: each rank ends with a neighbour average, "
                "not the global average DDP needs to keep replicas identical. Train decentralized with "
                f"gradzip.Aggregation({spec!r})(model) after each optimizer step instead.")
        if start_iter < 1:
            raise ValueError("gradzip.hooks.State: start_iter must be >= 1 (DDP rebuilds buckets after iteration 1)")
        self.spec = canonical_spec(spec)
        self.process_group = process_group
        self.start_iter = start_iter
        self.iteration = 0
        self._aggregation = _C.Aggregation(self.spec)
        self._exact = _C.Aggregation("allreduce")

    def stats(self) -> dict:
        """Bytes moved by this hook since the last reset_stats(), exact iterations included."""
        a, b = self._aggregation.stats(), self._exact.stats()
        return {k: a[k] + b[k] for k in a}

    def reset_stats(self) -> None:
        self._aggregation.reset_stats()
        self._exact.reset_stats()

    def state_dict(self) -> dict:
        """Everything a resumed job needs to continue bit-exactly (no process group)."""
        return {"spec": self.spec, "start_iter": self.start_iter, "iteration": self.iteration,
                "buckets": self._aggregation.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if canonical_spec(state["spec"]) != self.spec:
            raise ValueError(f"gradzip.hooks: the saved state is for {state['spec']!r}, this State runs {self.spec!r}")
        self.start_iter, self.iteration = state["start_iter"], state["iteration"]
        self._aggregation.load_state_dict(state["buckets"])

    def __getstate__(self):  # pickling drops the process group, as PowerSGDState does
        return self.state_dict()

    def __setstate__(self, state):
        self.__init__(state["spec"])
        self.load_state_dict(state)


def hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket over the ranks with the state's aggregation."""
    buffer = bucket.buffer()
    transport = transport_of(state.process_group, buffer.device)
    aggregation = state._aggregation if state.iteration >= state.start_iter else state._exact
    aggregation.allreduce(buffer, f"bucket:{bucket.index()}", dist.ReduceOp.AVG, transport)
    if bucket.is_last():
        state.iteration += 1
    future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
    future.set_result(buffer)
    return future
