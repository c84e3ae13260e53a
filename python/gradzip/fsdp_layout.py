"""Where each parameter sits in FSDP2's reduce-scatter input, for layer-aware compression.

FSDP2 reduce-scatters an FSDP module's gradients as one flat input of P chunks; chunk r
is rank r's padded shard (`padded_sharded_param_size`) of every parameter that has a
gradient this step, in the order of its parameter group (FSDPParamGroup.fsdp_params).
shard_layout() reads that layout from the group's FSDPParams (private FSDP2 attributes:
it says so, and the caller compresses each chunk whole, where they are missing). Which
parameters had no gradient is not recorded by FSDP2 at the reduce-scatter; it is found
as the one subset of the parameters with requires_grad whose shards make the chunk, or
not known when several do.
"""
from torch.distributed.fsdp import FSDPModule


def _group_layouts(module: FSDPModule) -> list[list[tuple[str, int, bool]]]:
    """Each FSDP2 parameter group of `module`: its parameters' (name, numel of one rank's
    padded shard, requires_grad), in the order FSDP2 lays out a reduce-scatter input."""
    fsdp_state = module._get_fsdp_state()
    groups = getattr(fsdp_state, "_fsdp_param_groups", None)
    if groups is None:  # torch before parameter groups were a list
        groups = [g for g in [getattr(fsdp_state, "_fsdp_param_group", None)] if g is not None]
    layouts = []
    for group in groups:
        layout = []
        for i, fsdp_param in enumerate(group.fsdp_params):
            name = getattr(fsdp_param, "_param_fqn", None) or f"parameter {i}"
            layout.append((name, fsdp_param.padded_sharded_param_size.numel(), fsdp_param.sharded_param.requires_grad))
        layouts.append(layout)
    return layouts


def shard_layout(module: FSDPModule, chunk_numel: int) -> tuple[list[tuple[str, int]] | None, str]:
    """The (parameter name, numel) pieces of each rank's chunk of `module`'s reduce-scatter
    input of chunk_numel elements per rank, and "" ; or None and why it is not known."""
    try:
        layouts = _group_layouts(module)
    except AttributeError as e:
        return None, f"this torch's FSDP2 does not expose its parameter layout ({e})"
    found = []  # the layouts whose parameters with a gradient could make the chunk
    unsearched = False
    for layout in layouts:
        candidates = [(name, numel) for name, numel, requires_grad in layout if requires_grad and numel > 0]
        if sum(numel for _, numel in candidates) == chunk_numel:
            found.append(candidates)  # every parameter had a gradient: the usual case
        elif len(candidates) <= _MOST_PARAMETERS_SEARCHED:  # some had none this step: which?
            found.extend(p for p in _subsets_of_size(candidates, chunk_numel) if p not in found)
        else:
            unsearched = True
    if len(found) == 1:
        return found[0], ""
    if not found:
        if unsearched:
            return None, (f"some of its parameters had no gradient this step, and with more than "
                          f"{_MOST_PARAMETERS_SEARCHED} parameters which ones is not searched for")
        return None, (f"no parameter group's parameters with requires_grad make its chunk of {chunk_numel} "
                      "elements")
    return None, (f"{len(found)} sets of its parameters make its chunk of {chunk_numel} elements (parameters "
                  "without a gradient this step, whose sizes do not tell which)")


_MOST_PARAMETERS_SEARCHED = 12  # a module's parameters whose subsets shard_layout searches (4096 sums)


def _subsets_of_size(pieces: list, total: int) -> list:
    """Every ordered subset of `pieces` whose numels add up to `total` (a reduce-scatter
    input leaves out the parameters without a gradient)."""
    found = []
    for mask in range(1, 1 << len(pieces)):
        subset = [p for i, p in enumerate(pieces) if mask >> i & 1]
        if sum(numel for _, numel in subset) == total:
            found.append(subset)
    return found
