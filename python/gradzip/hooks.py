"""gradzip as a DDP comm hook, over any process group (nccl, gloo, gradzip).

    state = gradzip.hooks.State("stc:density=0.01")
    ddp.register_comm_hook(state, gradzip.hooks.hook)

Each bucket is aggregated with the spec's aggregation and averaged over the ranks
(DDP does not average when a hook is registered; the hook does). The hook returns at
once (but the last, which waits for all: DDP issues its own calls on the group next):
CPU buckets are aggregated on a worker thread, in bucket order, while autograd
computes the gradients of the next buckets; the future completes when the bucket's
result is in place. CUDA buckets too, on a side stream that waits for the stream the
bucket was computed on; the future makes its waiters' streams wait for the result.
Error feedback is kept per bucket index, or per parameter name when the State is given
the model. With the model, a bucket is compressed parameter by parameter (CPU buckets;
docs/spec.md, "Layer-aware compression"): by default (`layers=auto`) top-k, random-k,
STC and QSGD choose each parameter's density (QSGD: levels) under the bytes of the
spec's, sign keeps its block scales within each parameter, and parameters under 1024
elements go exact; `layers=off` compresses each bucket as one tensor. DDP rebuilds
its buckets after the first iteration, so the first `start_iter` iterations go exact and
compressed state starts after them. The returned future holds the bucket's buffer, as
PyTorch's own hooks do.

Membership changes (a fault-tolerant job such as torchft's, gradzip.torchft):
State.set_process_group() moves the State to the next membership's group, rescaling its
error feedback by the rule there; peer_state_dict() is what a replica joining the job takes
from a peer (counters, no residuals); snapshot() / restore() undo a step the job discards.

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
from ._transport import drain, size_and_rank, transport_of, use_node_levels
from .checkpoint import hook_state, require_same_spec, stamped
from .momentum_folding import HOOK_DENSITY_WARMUP, fold_optimizer_momentum
from .spec import Spec, bind_spec
from .rank_agreement import require_same_start
from .world_portable import (MASS_FIELDS, WORLD_BOUND_FIELDS, counters_digest, field_of, l1_mass, require_same_world,
                             state_for_world)


class State:
    """State of the gradzip comm hook; every option has a default.

    spec: the aggregation spec, a string or a gradzip.Spec, e.g. "stc:density=0.01",
        "topk:density=0.01", "sign", "qsgd:bits=4" (docs/spec.md).
    process_group: the group to aggregate over (default: the default group).
    start_iter: iterations that go exact before compression starts; at least 1,
        because DDP rebuilds its buckets after the first iteration (default 1).
    model: the DDP model (or the module it wraps). When given, error feedback is kept
        per parameter name instead of per bucket, which survives DDP's bucket rebuild
        and a resume, and lets the spec's `layers` compress per parameter (default None:
        per bucket index, each bucket as one tensor).
    scaler: the torch.amp.GradScaler that scales the loss (default None: none). Its
        scale is read at each iteration's first bucket, and error feedback rescales its
        residuals when it changes, so they keep their weight (docs/spec.md, "Loss scaling").
    optimizer: the torch.optim.SGD that steps the model (default None). Its momentum
        moves into the aggregation when the spec's codec takes `momentum` and the spec
        sets none: momentum correction (with a sparsifier, the density warm-up of 20
        calls where the spec sets none), the optimizer's momentum set to 0
        (gradzip.momentum_folding). Give it before loading the optimizer's state_dict.
    """

    def __init__(self, spec, process_group=None, start_iter: int = 1, model=None, scaler=None, optimizer=None):
        bound = bind_spec(spec)
        if bound.decentralized:
            raise ValueError(
                f"gradzip.hooks: {bound.name!r} is decentralized gossip: each rank ends with a neighbour average, "
                "not the global average DDP needs to keep replicas identical. Train decentralized with "
                f"gradzip.Aggregation({str(bound)!r})(model) after each optimizer step instead.")
        if start_iter < 1:
            raise ValueError("gradzip.hooks.State: start_iter must be >= 1 (DDP rebuilds buckets after iteration 1)")
        bound = fold_optimizer_momentum(bound, optimizer, "gradzip.hooks.State", HOOK_DENSITY_WARMUP)
        self.spec: Spec = bound
        self.process_group = process_group
        self.start_iter = start_iter
        self.iteration = 0
        self._aggregation = _C.Aggregation(bound)
        self._exact = _C.Aggregation(Spec("allreduce"))
        module = getattr(model, "module", model)
        self._names = None if model is None else {id(p): name for name, p in module.named_parameters()}
        self.scaler = scaler
        self._node_levels_asked = False  # the hierarchical exchange's groups, made at the first compressed bucket
        self._agree = True  # the ranks check that they run the same spec from the same point at the next bucket 0

    def stats(self) -> dict:
        """Bytes moved by this hook since the last reset_stats(), exact iterations included."""
        a, b = self._aggregation.stats(), self._exact.stats()
        return {k: a[k] + b[k] for k in a}

    def reset_stats(self) -> None:
        self._aggregation.reset_stats()
        self._exact.reset_stats()

    def state_dict(self, portable: bool = False) -> dict:
        """Everything a resumed job needs to continue bit-exactly (no process group):
        the spec's text, the iteration counters, and the aggregation's state as named
        tensors ("<key>/<field>", keyed by bucket index or by parameter name), for this
        rank of this world size. portable=True: a collective over the group giving every
        rank the same dict, loadable at any world size (gradzip.world_portable)."""
        state = {"spec": str(self.spec), "start_iter": self.start_iter, "iteration": self.iteration}
        return state_for_world(state, "state", self._aggregation.state_dict(), self.process_group, "gradzip.hooks",
                               portable)

    def load_state_dict(self, state: dict) -> None:
        """Reads a state_dict() of this build or of an earlier one (gradzip.checkpoint)."""
        state = hook_state(state)
        require_same_world(state, self.process_group, "gradzip.hooks")
        require_same_spec("gradzip.hooks", state["spec"], self.spec,
                          "format 0 or 1 ran with layers=off, the default then", "give State", state["state"])
        self.start_iter, self.iteration = state["start_iter"], state["iteration"]
        self._aggregation.load_state_dict(state["state"])
        self._agree = True

    def set_process_group(self, group, previous_size: int = None) -> float:
        """Aggregates over `group` from the next bucket on: the group of a new membership (a
        torchft quorum), which torch.distributed need not know. Every rank of `group` must call
        it before the same step: the next bucket 0 checks again, on `group`, that its
        ranks run the same spec from the same point (a collective, as at the first bucket).

        previous_size: the number of ranks W the error feedback was accumulated over (None:
        leave it as it is: a State that has not aggregated, or one that took a peer's state).
        When the new group's size W' differs, each residual and velocity is multiplied by W'/W,
        so that the ranks that stay keep their share of the update not yet applied:
        (1/W')·Σ e' over them equals (1/W)·Σ e over them (a rank that joins holds zeros). The
        two-phase owners' residuals (exchange=twophase: chunk bounds move with the size) are
        dropped. Returns the L1 mass of what was dropped (0.0 when nothing was)."""
        self.process_group = group
        self._node_levels_asked = False
        self._agree = True
        size = size_and_rank(group)[0]
        if previous_size is None or previous_size == size:
            return 0.0
        tensors = self._aggregation.state_dict()
        self._aggregation.load_state_dict({
            name: value * (size / previous_size) if field_of(name) in MASS_FIELDS else value
            for name, value in tensors.items() if field_of(name) not in WORLD_BOUND_FIELDS})
        return l1_mass(tensors, ("owner_residual",))

    def residual_mass(self, snapshot: dict = None) -> float:
        """The L1 norm of this rank's error feedback not yet sent: its residuals and, with
        exchange=twophase, its owners' residuals (0.0 before the first compressed step); of
        `snapshot` (a snapshot() of this State) when given, without copying the state again."""
        tensors = snapshot["state"] if snapshot is not None else self._aggregation.state_dict()
        return l1_mass(tensors, ("residual", "owner_residual"))

    def peer_state_dict(self) -> dict:
        """What a rank joining the job (a healed torchft replica) takes from this one: the spec,
        the iteration counters and every key's counters (calls, step, chosen level, loss
        scale), so that it compresses exactly as this rank does from the next step, with its
        residuals and velocities zero: they are this rank's own mass not yet sent, which the
        group's average still owes through this rank, and a copy would send it twice. The
        two-phase owners' residuals are left out. Unstamped (no rank, no world size), so any
        rank's load_state_dict() takes it; its tensors are copies (as every state_dict()'s), safe
        to serve while this rank goes on training."""
        tensors = {name: torch.zeros_like(value) if field_of(name) in MASS_FIELDS else value
                   for name, value in self._aggregation.state_dict().items()
                   if field_of(name) not in WORLD_BOUND_FIELDS}
        return stamped({"spec": str(self.spec), "start_iter": self.start_iter, "iteration": self.iteration,
                        "state": tensors})

    def snapshot(self) -> dict:
        """This rank's state as it is now (a state_dict() of copies, not stamped), for
        restore(): taken before a step that may be discarded. Costs one copy of the error
        feedback (the aggregation's state_dict() copies its tensors)."""
        return stamped({"spec": str(self.spec), "start_iter": self.start_iter, "iteration": self.iteration,
                        "state": self._aggregation.state_dict()})

    def restore(self, snapshot: dict) -> None:
        """Puts back a snapshot() of this State: the residuals, velocities and counters are bit
        for bit what they were, as if the steps since had not run (their bytes stay counted
        in stats())."""
        self.start_iter, self.iteration = snapshot["start_iter"], snapshot["iteration"]
        self._aggregation.load_state_dict(snapshot["state"])

    def _position(self) -> str:
        """Where this rank is in its aggregation, which the ranks must agree on: a rank resumed
        from an older checkpoint than the others would compress at another density, or choose
        levels at other calls, and the calls would not match."""
        return (f"iteration {self.iteration} (start_iter {self.start_iter}), counters "
                f"{counters_digest(self._aggregation.state_dict())}")

    def __getstate__(self):  # pickling drops the process group, as PowerSGDState does
        return self.state_dict()

    def __setstate__(self, state):
        self.__init__(state["spec"])
        self.load_state_dict(state)

    def _pieces(self, bucket: dist.GradBucket) -> list:
        """The bucket's parameters as (name, numel): their state is kept per parameter."""
        try:
            return [(self._names[id(p)], p.numel()) for p in bucket.parameters()]
        except KeyError:
            raise RuntimeError("gradzip.hooks: a bucket holds a parameter of another model than State(model=...)")


def hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket over the ranks with the state's aggregation."""
    buffer = bucket.buffer()
    if bucket.index() == 0:
        # DDP may have issued calls of its own on the group before this iteration's first
        # bucket (static_graph's map of used parameters): on a gradzip group they are
        # queued on its worker, and the buckets' calls must not overtake them.
        drain(state.process_group, buffer.device)
    transport = transport_of(state.process_group, buffer.device)
    if bucket.index() == 0 and state._agree:
        # Every rank is here, at bucket 0 of its first iteration or of the first after a
        # load or a new group, with the group's queued calls drained: the ranks check that
        # they run the same spec from the same point before any payload moves.
        state._agree = False
        require_same_start(transport, size_and_rank(state.process_group)[0], state.spec, state._position(),
                           buffer.device)
    whole = [(f"bucket:{bucket.index()}", buffer.numel())]
    if state.iteration < state.start_iter:
        work = state._exact.submit_pieces(buffer, whole, dist.ReduceOp.AVG, transport)
    else:
        pieces = state._pieces(bucket) if state._names is not None else whole
        if bucket.index() == 0 and state.scaler is not None:
            state._aggregation.set_loss_scale(state.scaler.get_scale())
        if not state._node_levels_asked:
            # Every rank is here, at bucket 0 of the first compressed iteration, with the
            # group's queued calls drained: the groups of the nodes can be made.
            state._node_levels_asked = True
            use_node_levels(state._aggregation, state.spec, state.process_group, transport, buffer.device)
        work = state._aggregation.submit_pieces(buffer, pieces, dist.ReduceOp.AVG, transport)
    if bucket.is_last():
        state.iteration += 1
        # Right after the last bucket's hook DDP issues calls of its own on the group (the
        # map of used parameters, with find_unused_parameters=True): the buckets' queued
        # calls must be out of the way, or ranks could issue them in different orders.
        # DDP waits for every bucket next anyway.
        work.wait()
    return work.get_future().then(lambda fut: fut.value()[0])
