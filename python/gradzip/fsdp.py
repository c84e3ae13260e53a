"""Compressed gradients for FSDP2 (`torch.distributed.fsdp.fully_shard`).

    model = ...; fully_shard(layer) for each layer; fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = gradzip.fsdp.compress(model, "stc:density=0.01", optimizer=opt)

FSDP2 reduce-scatters each FSDP module's gradients in one flat tensor. compress() sets
every FSDP module's custom reduce-scatter to gradzip's compressed one: each rank encodes
its (error-compensated) input as P chunks, the chunks go all-to-all, and each rank decodes
the P pieces of its own shard in rank order into fp32 (docs/spec.md, "Reduce-scatter").
Any element count, any world size; error feedback is kept per FSDP module and input size
(key "<module name>:<numel>": FSDP leaves parameters without a gradient out), so it
follows the module's gradients from step to step and through state_dict() /
load_state_dict(). Layer-aware (the spec's `layers`; auto: adapt for top-k, random-k, STC
and QSGD, on for sign; CPU tensors): each rank's chunk of the input is its shard of every
parameter with a gradient, in order, and each parameter's shard is compressed by itself
(shards under 1024 elements exact), with layers=adapt at a density chosen per parameter,
the same in every chunk. The layout is read from FSDP2's parameter groups
(gradzip.fsdp_layout); where it cannot be (parameters without a gradient this step that
their sizes do not tell apart, or a torch whose FSDP2 lacks the attributes), the chunk goes
whole, with a warning once per module. Given the optimizer, SGD's momentum moves into the
reduce-scatter for the codecs that take `momentum` (momentum correction:
gradzip.momentum_folding). The spec's reduce_scatter key concerns the gradzip backend
only: here the reduce-scatter is always the spec's. A reduce-scatter that goes exact (a dtype or op the
codec does not take, or one that compression would not shrink) warns once, naming why.

The reduce-scatter runs over the group FSDP passes (its mesh's), or over `process_group`
when given (the same ranks); gloo, nccl and gradzip groups all work.
"""
import warnings

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from ._extension import _C
from .checkpoint import fsdp_state, require_same_spec, stamped
from .fsdp_layout import shard_layout
from .momentum_folding import fold_optimizer_momentum
from ._transport import transport_of, use_node_levels
from .spec import Spec, bind_spec
from .rank_agreement import require_same_start
from .fsdp_portable import ROOT, module_name, to_inputs, to_parameters
from .world_portable import counters_digest, require_same_world, state_for_world


class State:
    """The compressed reduce-scatter's state, shared by the FSDP modules of one model.

    spec: the aggregation spec, e.g. "qsgd:bits=4", "stc:density=0.01" (docs/spec.md).
    process_group: the group to reduce over (default None: the group FSDP passes).
    optimizer: the torch.optim.SGD that steps the model (default None). Its momentum
        moves into the reduce-scatter when the spec's codec takes `momentum` and the spec
        sets none: momentum correction, each rank's velocity compressed with error
        feedback, the optimizer's momentum set to 0 (gradzip.momentum_folding). Give it
        before loading the optimizer's state_dict.
    """

    def __init__(self, spec, process_group=None, optimizer=None):
        bound = bind_spec(spec)
        if bound.decentralized:
            raise ValueError(f"gradzip.fsdp: {bound.name!r} is decentralized gossip, not a reduce-scatter; "
                             "FSDP needs every rank's shard of the global gradient")
        bound = fold_optimizer_momentum(bound, optimizer, "gradzip.fsdp.State")
        self.spec: Spec = bound
        self.process_group = process_group
        self._aggregation = _C.Aggregation(bound)
        self.layer_aware: bool = self._aggregation.by_layers  # the spec's layers, auto resolved, not off
        self._node_levels_asked = False  # the hierarchical exchange's groups, made at the first call
        self._agree = True  # the ranks check that they run the same spec from the same point at the next call
        self._modules = {}  # the FSDP modules compress() set, by key
        self._group = process_group  # the reduce-scatter's group (None: the default group until the first call)

    def stats(self) -> dict:
        """Bytes the reduce-scatters sent since the last reset_stats() ("dense_bytes": a dense fp32 ring's)."""
        return self._aggregation.stats()

    def reset_stats(self) -> None:
        self._aggregation.reset_stats()

    def state_dict(self, portable: bool = False) -> dict:
        """The spec's text and the error feedback as named tensors ("<module>:<input
        numel>/<field>"), for this rank of this world size. portable=True: a collective over
        the reduce-scatter's group giving every rank the same dict, loadable at any world
        size: each residual and velocity cut by parameter, then gradzip.world_portable's rule
        (gradzip.fsdp_portable)."""
        if not portable:
            return state_for_world({"spec": str(self.spec)}, "state", self._aggregation.state_dict(), self._group,
                                   "gradzip.fsdp", False)
        size = dist.get_world_size(self._group)
        by_parameter = to_parameters(self._aggregation.state_dict(), self._modules, size)
        return state_for_world({"spec": str(self.spec)}, "state", by_parameter, self._group, "gradzip.fsdp", True)

    def load_state_dict(self, state: dict) -> None:
        """Reads a state_dict() of this build or of an earlier one (gradzip.checkpoint); a
        portable one (state_dict(portable=True)) at any world size, after compress()."""
        state = fsdp_state(state)
        require_same_world(state, self._group, "gradzip.fsdp")
        require_same_spec("gradzip.fsdp", state["spec"], self.spec,
                          "format 1 or 2 compressed each chunk whole, as layers=off", "give", state["state"])
        tensors = to_inputs(state["state"], self._modules) if state.get("portable") else state["state"]
        self._aggregation.load_state_dict(tensors)
        self._agree = True

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, key: str, op, group,
                       pieces: list[tuple[str, int]] | None = None) -> None:
        """Reduces `input` (group size × output.numel() elements) into this rank's `output`;
        `pieces`: each chunk's (parameter name, numel) layout, or None (each chunk whole)."""
        group = self.process_group if self.process_group is not None else group
        self._group = group
        transport = transport_of(group, input.device)
        if self._agree:  # every rank is in its first call, or its first after a load: a collective point
            self._agree = False
            require_same_start(transport, dist.get_world_size(group), self.spec,
                               f"counters {counters_digest(self._aggregation.state_dict())}", input.device)
        if not self._node_levels_asked:
            self._node_levels_asked = True
            use_node_levels(self._aggregation, self.spec, group, transport, input.device)
        self._aggregation.reduce_scatter(output, input, key, op, transport, pieces or [])


class CompressedReduceScatter(ReduceScatter):
    """FSDP2's ReduceScatter for one FSDP module, through a State under `key`; layer-aware
    with the pieces shard_layout() reads from `module`."""

    def __init__(self, state: State, key: str, module: FSDPModule):
        self.state = state
        self.key = key
        self.module = module
        self._said_whole = False

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, op,
                 async_op: bool = False):
        if self.state.process_group is not None and self.state.process_group.size() != group.size():
            raise ValueError(f"gradzip.fsdp: process_group has {self.state.process_group.size()} ranks, FSDP's "
                             f"reduce-scatter group {group.size()}; they must be the same ranks")
        # FSDP leaves parameters without a gradient out of the input: each size the module's
        # input takes keeps its own error feedback.
        pieces, why = shard_layout(self.module, output_tensor.numel(), module_name(self.key))
        if pieces is None and not self._said_whole and self.state.layer_aware:
            self._said_whole = True
            warnings.warn(f"gradzip.fsdp: the reduce-scatter of FSDP module {self.key!r} compresses each chunk "
                          f"whole, not parameter by parameter: {why}", stacklevel=2)
        self.state.reduce_scatter(output_tensor, input_tensor, f"{self.key}:{input_tensor.numel()}", op, group,
                                  pieces)
        return None


def compress(module: torch.nn.Module, spec, process_group=None, optimizer=None) -> State:
    """Sets the compressed reduce-scatter on every FSDP module of `module` (after
    fully_shard) and returns its State (stats, state_dict, load_state_dict); `spec` is a
    spec or a State, `process_group` and `optimizer` as State takes them."""
    if isinstance(spec, State) and (process_group is not None or optimizer is not None):
        raise ValueError("gradzip.fsdp.compress: give process_group and optimizer to the State, not beside it")
    state = spec if isinstance(spec, State) else State(spec, process_group, optimizer)
    found = 0
    for name, sub in module.named_modules():
        if isinstance(sub, FSDPModule):
            state._modules[name or ROOT] = sub
            sub.set_custom_reduce_scatter(CompressedReduceScatter(state, name or ROOT, sub))
            found += 1
    if not found:
        raise ValueError("gradzip.fsdp.compress: the module holds no FSDP module; call fully_shard() on it first")
    return state
