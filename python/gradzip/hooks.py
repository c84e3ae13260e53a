"""gradzip as a DDP comm hook, over any process group (nccl, gloo, gradzip).

    state = gradzip.hooks.State("stc:density=0.01")
    ddp.register_comm_hook(state, gradzip.hooks.hook)

Each bucket is aggregated with the spec's aggregation and averaged over the ranks
(DDP does not average when a hook is registered; the hook does). Error feedback is kept
per bucket index, or per parameter name when the State is given the model. DDP rebuilds
its buckets after the first iteration, so the first `start_iter` iterations go exact and
compressed state starts after them. The returned future holds the bucket's buffer, as
PyTorch's own hooks do.

Resuming: State.state_dict() / load_state_dict(). A new DDP starts with its initial
bucket layout again, so per-bucket residuals no longer line up in the resumed job's
first iteration; with State(..., model=ddp) they are kept per parameter and a resumed
job continues bit-exactly for the per-element codecs (top-k, STC, sign with block=0,
fp16, bf16). Codecs that work on blocks of the bucket — sign's block scales, QSGD's
buckets, random-k's draws — follow the bucket layout, so their first resumed iteration
differs from an uninterrupted run's.
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
    model: the DDP model (or the module it wraps). When given, error feedback is kept
        per parameter name instead of per bucket, which survives DDP's bucket rebuild
        and a resume (default None: per bucket index).
    """

    def __init__(self, spec: str, process_group=None, start_iter: int = 1, model=None):
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
        module = getattr(model, "module", model)
        self._names = None if model is None else {id(p): name for name, p in module.named_parameters()}
        self._residuals = {}  # parameter name -> residual, when the model was given

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
                "buckets": self._aggregation.state_dict(),
                "parameters": {name: r.clone() for name, r in self._residuals.items()}}

    def load_state_dict(self, state: dict) -> None:
        if canonical_spec(state["spec"]) != self.spec:
            raise ValueError(f"gradzip.hooks: the saved state is for {state['spec']!r}, this State runs {self.spec!r}")
        self.start_iter, self.iteration = state["start_iter"], state["iteration"]
        self._aggregation.load_state_dict(state["buckets"])
        self._residuals = {name: r.clone() for name, r in state["parameters"].items()}

    def __getstate__(self):  # pickling drops the process group, as PowerSGDState does
        return self.state_dict()

    def __setstate__(self, state):
        self.__init__(state["spec"])
        self.load_state_dict(state)

    def _allreduce_per_parameter(self, bucket: dist.GradBucket, buffer: torch.Tensor, transport) -> None:
        """The bucket's residual is assembled from, and returned to, its parameters' residuals."""
        params = bucket.parameters()
        try:
            names = [self._names[id(p)] for p in params]
        except KeyError:
            raise RuntimeError("gradzip.hooks: a bucket holds a parameter of another model than State(model=...)")
        residual = torch.cat([self._residuals.get(name, torch.zeros(p.numel())) for name, p in zip(names, params)])
        done = self.iteration - self.start_iter  # compressed iterations so far: the same for every bucket
        self._aggregation.set_tensor_state("bucket", {"residual": residual, "calls": done, "step": done})
        self._aggregation.allreduce(buffer, "bucket", dist.ReduceOp.AVG, transport)
        after = self._aggregation.tensor_state("bucket")["residual"]  # unchanged when error feedback is off
        for name, part in zip(names, after.split([p.numel() for p in params])):
            self._residuals[name] = part.clone()


def hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket over the ranks with the state's aggregation."""
    buffer = bucket.buffer()
    transport = transport_of(state.process_group, buffer.device)
    if state.iteration < state.start_iter:
        state._exact.allreduce(buffer, f"bucket:{bucket.index()}", dist.ReduceOp.AVG, transport)
    elif state._names is not None:
        state._allreduce_per_parameter(bucket, buffer, transport)
    else:
        state._aggregation.allreduce(buffer, f"bucket:{bucket.index()}", dist.ReduceOp.AVG, transport)
    if bucket.is_last():
        state.iteration += 1
    future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
    future.set_result(buffer)
    return future
