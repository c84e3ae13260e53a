"""The optimizer's momentum moved into the aggregation: momentum correction (DGC), for the
doors that are given the optimizer (gradzip.hooks.State, gradzip.fsdp.compress).

A sparsifier with error feedback that runs under SGD's momentum sends each coordinate's
accumulated mass late and then lets the optimizer's momentum amplify it; keeping the
velocity in the aggregation instead (u = m·u + g, compressed with error feedback, the
optimizer without momentum) is the recipe DGC and the measurements in docs/results.md
support. A user who gives the optimizer gets it without writing `momentum=` in the spec,
and at the DDP hook, for the sparsifiers, DGC's density warm-up over the first
HOOK_DENSITY_WARMUP calls of each tensor unless the spec sets `density_warmup` itself.
"""
import torch

from .spec import Spec, aggregations, bind_spec

# The density warm-up a sparsifier folded at the DDP hook takes when its spec sets none:
# calls of each tensor, 5 at each of 25%, 6.25%, 1.56% and 0.39% (never below the spec's
# density). Momentum correction's first sparse steps can kill a network's units (the demo
# CNN at the hook, STC 1% at lr 0.1: one seed of three stopped learning in its first
# epoch); this guard kept all three, and costs a long job nothing. Longer warm-ups cost a
# short network-bound job its time to accuracy, and the FSDP door takes none: there a
# warm-up ended lower (docs/results.md, "Main job").
HOOK_DENSITY_WARMUP = 20


def fold_optimizer_momentum(spec: Spec, optimizer, door: str, density_warmup: int = 0) -> Spec:
    """`spec` with the momentum of `optimizer` (a torch.optim.SGD) moved into the
    aggregation: momentum correction (DGC, docs/spec.md "Momentum correction"), each
    rank compressing its velocity with error feedback, and `density_warmup` calls of
    density warm-up (when above 0) where the codec takes one and the spec sets none.
    The optimizer's momentum is then
    set to 0 and its momentum buffers dropped, so momentum is applied once. Returns
    `spec` unchanged, the optimizer untouched, when there is nothing to fold: another
    optimizer (Adam's moments, RMSprop's momentum are not SGD's velocity), momentum 0, an
    aggregation without the `momentum` key, or one without error feedback. Raises
    ValueError for what cannot be folded: Nesterov momentum, dampening, param groups of
    different momenta, or a spec that sets `momentum` itself (momentum applied twice);
    `door` (e.g. "gradzip.hooks.State") names the caller in the message."""
    if optimizer is None or not isinstance(optimizer, torch.optim.SGD):
        return spec
    momenta = sorted({float(group["momentum"]) for group in optimizer.param_groups})
    if momenta == [0.0] or "momentum" not in aggregations()[spec.name]["keys"] or not spec.uses_error_feedback:
        return spec
    where = f"{door}(optimizer=...): the optimizer's momentum cannot move into '{spec}'"
    if "momentum" in spec.params:
        raise ValueError(f"{where}: the spec's momentum={spec.params['momentum']} and the optimizer's "
                         f"momentum={momenta[-1]} would apply momentum twice; set one of them")
    if len(momenta) > 1:
        raise ValueError(f"{where}: its param groups have momenta {momenta}; momentum correction keeps one velocity "
                         "per tensor with one momentum")
    if any(group.get("nesterov") for group in optimizer.param_groups):
        raise ValueError(f"{where}: it is Nesterov momentum, and momentum correction folds plain momentum; "
                         "use nesterov=False, or leave the optimizer out")
    if any(group.get("dampening") for group in optimizer.param_groups):
        raise ValueError(f"{where}: it has dampening, and momentum correction folds undampened momentum")
    added = f"momentum={momenta[0]!r}"
    if density_warmup > 0 and "density_warmup" in aggregations()[spec.name]["keys"] and \
            "density_warmup" not in spec.params:
        added += f",density_warmup={density_warmup}"
    folded = bind_spec(f"{spec},{added}" if spec.params else f"{spec}:{added}")
    for group in optimizer.param_groups:
        group["momentum"] = 0.0
        for p in group["params"]:
            optimizer.state.get(p, {}).pop("momentum_buffer", None)
    return folded


def fold_momentum(optimizer, group=None) -> Spec:
    """The backend door's momentum correction: moves `optimizer`'s SGD momentum into the
    aggregation of `group` (a gradzip process group; default: the default group), as
    gradzip.hooks.State(optimizer=...) does at the hook, with its density warm-up. A
    training script calls it once, on every rank, after making its optimizer and before
    the group's first compressed all_reduce (and before loading a checkpoint of the
    group's state, which names the folded spec). Returns the group's spec, folded or, when
    there is nothing to fold (see fold_optimizer_momentum), unchanged. Raises ValueError
    when the ranks fold differently (their specs would then differ) and RuntimeError once
    the group holds state."""
    from .rank_agreement import describe, require_agreement
    from .stats import _backend

    backend = _backend(group, "gradzip.fold_momentum")
    current = bind_spec(str(backend.spec))
    held = len(backend.state_dict())
    if held:  # before the optimizer is touched
        raise RuntimeError(f"gradzip.fold_momentum: the group's aggregation '{current}' already holds state for "
                           f"{held} tensor fields: call it before the group's first compressed all_reduce")
    folded = fold_optimizer_momentum(current, optimizer, "gradzip.fold_momentum", HOOK_DENSITY_WARMUP)
    cpu = backend.transport("cpu")
    require_agreement(cpu, cpu.size(), describe(f"spec '{folded}' (gradzip.fold_momentum)"))
    if folded is not current:
        backend.use_spec(folded)
    return folded
