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
from dataclasses import dataclass

from torch.distributed.fsdp import FSDPModule


@dataclass(frozen=True)
class ParameterShards:
    """How FSDP2 shards one parameter: `world` dim-0 shards of `padded` elements each (the
    last ones padded, or all padding), whose concatenation in rank order starts with the
    parameter's `numel` elements."""
    padded: int
    numel: int
    world: int


def parameter_shards(module: FSDPModule, prefix: str) -> dict:
    """Each parameter of `module`'s FSDP2 parameter groups by its name in the model (`prefix`:
    the module's own name there, "" for the root), before FSDP2's first forward as after it:
    its ParameterShards. Raises ValueError for a parameter sharded on another dim than 0
    (FSDP2 with tensor parallelism), whose shards do not concatenate into it."""
    names = _names(module, prefix)
    shards = {}
    for group in _groups(module):
        for fsdp_param in group.fsdp_params:
            name = names(fsdp_param)
            if getattr(fsdp_param.fsdp_placement, "dim", 0) != 0:
                raise ValueError(f"gradzip.fsdp: parameter {name!r} is sharded on dim {fsdp_param.fsdp_placement.dim}, "
                                 "not 0: its shards do not concatenate into it")
            shards[name] = ParameterShards(fsdp_param.padded_sharded_param_size.numel(),
                                           fsdp_param._orig_size.numel(), fsdp_param.mesh_info.shard_mesh_size)
    return shards


def _names(module: FSDPModule, prefix: str):
    """The function naming `module`'s FSDPParams in the model (`prefix`: the module's name
    there, "" for the root): the FQN FSDP2 gives them at its first forward, also before."""
    within = {id(m): n for n, m in module.named_modules()}

    def name(fsdp_param) -> str:
        info = fsdp_param._module_info
        return ".".join(part for part in (prefix, within[id(info.module)], info.param_name) if part)
    return name


def _groups(module: FSDPModule) -> list:
    """`module`'s FSDP2 parameter groups."""
    fsdp_state = module._get_fsdp_state()
    groups = getattr(fsdp_state, "_fsdp_param_groups", None)
    if groups is None:  # torch before parameter groups were a list
        groups = [g for g in [getattr(fsdp_state, "_fsdp_param_group", None)] if g is not None]
    return groups


def _group_layouts(module: FSDPModule, prefix: str) -> list[list[tuple[str, int, bool]]]:
    """Each FSDP2 parameter group of `module`: its parameters' (name, numel of one rank's
    padded shard, requires_grad), in the order FSDP2 lays out a reduce-scatter input."""
    names = _names(module, prefix)
    layouts = []
    for group in _groups(module):
        layout = []
        for fsdp_param in group.fsdp_params:
            layout.append((names(fsdp_param), fsdp_param.padded_sharded_param_size.numel(),
                           fsdp_param.sharded_param.requires_grad))
        layouts.append(layout)
    return layouts


def shard_layout(module: FSDPModule, chunk_numel: int, prefix: str) -> tuple[list[tuple[str, int]] | None, str]:
    """The (parameter name, numel) pieces of each rank's chunk of `module`'s reduce-scatter
    input of chunk_numel elements per rank (names in the model; `prefix`: the module's name
    there, "" for the root), and "" ; or None and why it is not known."""
    try:
        layouts = _group_layouts(module, prefix)
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
