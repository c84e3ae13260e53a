"""Checkpoint formats: what every door's state_dict() writes and load_state_dict() reads.

Every state_dict() carries "format": FORMAT. load_state_dict() reads every format a
gradzip build has written, migrating older ones as it loads them, and refuses a newer
one with an error that names both formats (CheckpointError, a ValueError).

  0  builds before 2026-11-23, no "format" field. The hook and gradzip.Aggregation kept
     each key's state as a dict {"residual", "calls", "step", "public_copies"}; the hook
     with model= kept its per-parameter residuals beside it ("parameters") and one
     shared call counter ("bucket"). Migrated: every residual, counter and public copy is
     carried over; the hook with model= gives each parameter the compressed iterations
     (iteration - start_iter) as its counters, so its warm-ups continue where they were,
     but its random draws (QSGD, random-k) after the resume differ from an uninterrupted
     format-0 run's, which counted steps over all buckets.
  1  2026-11-23 on: each key's state as named tensors, "<key>/<field>". States written
     before 2026-11-26 carry no "format" field. The FSDP door, DiLoCo and the backend
     door (gradzip.state_dict) start here.
  2  2026-11-27 on: the same fields; the hook's per-parameter compression (`layers`)
     defaults to auto instead of off, and a layers=adapt parameter keeps its "<key>/level".
     Migrated: a hook checkpoint of format 0 or 1 with state per parameter (model=) whose
     spec leaves `layers` out was written under layers=off, and reads as the spec with
     layers=off, which resumes it as it ran (a State of the bare spec refuses it, naming
     both specs). Without model= `layers` does nothing, and the spec stays.
  3  2026-11-28 on: the same fields; the FSDP door compresses each parameter's shard by
     itself (`layers`, auto by default), and a layers=adapt parameter keeps its level as
     "<module>:<numel>/<parameter>/level". Migrated: an FSDP checkpoint of format 1 or 2
     whose spec leaves `layers` out ran with each chunk whole, and reads as the spec with
     layers=off, which resumes it as it ran (a State of the bare spec refuses it, naming
     both specs).

A rank's own state_dict() of the hook, gradzip.Aggregation and the backend also carries
"world_size" and "rank" (older ones do not, and load anywhere); state_dict(portable=True)
carries "portable" instead (gradzip.world_portable). Both are fields within format 3.

Golden files of every format, written by the builds that shipped it, are loaded by
tests/python/test_checkpoints.py.
"""
import torch

from .momentum_folding import HOOK_DENSITY_WARMUP
from .spec import aggregations, bind_spec

FORMAT = 3


class CheckpointError(ValueError):
    """A checkpoint this build cannot read: another format, or not a gradzip state."""


def stamped(state: dict) -> dict:
    """`state` with this build's format."""
    return {"format": FORMAT, **state}


def hook_state(state) -> dict:
    """A gradzip.hooks.State checkpoint in this build's format."""
    old = isinstance(state, dict) and "buckets" in state and "state" not in state
    version = _format(state, "gradzip.hooks", format_0=old)
    if version == 0:
        per_key = state["buckets"]
        if state.get("parameters"):  # model=: state per parameter name, one shared counter before
            calls = max(0, int(state["iteration"]) - int(state["start_iter"]))
            per_key = {name: {"residual": residual, "calls": calls, "step": calls}
                       for name, residual in state["parameters"].items()}
        state = {"spec": state["spec"], "start_iter": state["start_iter"], "iteration": state["iteration"],
                 "state": _named_tensors(per_key, state["spec"], "gradzip.hooks")}
    _require(state, ("spec", "start_iter", "iteration", "state"), "gradzip.hooks")
    keyed_by_parameter = any(not key.startswith("bucket:") for key in state["state"])  # State(model=...)
    if version < 2 and keyed_by_parameter:
        state = {**state, "spec": _written_under_layers_off(state["spec"])}
    return state


def _written_under_layers_off(spec: str) -> str:
    """A spec written when its door's `layers` was off by default, as this build reads it."""
    bound = bind_spec(spec)
    if "layers" in bound.params or "layers" not in aggregations()[bound.name]["keys"]:
        return spec
    return str(bind_spec(f"{spec}{',' if ':' in spec else ':'}layers=off"))


def require_same_spec(door: str, saved: str, running, layers_was_off: str, give: str, tensors: dict) -> None:
    """Refuses a checkpoint whose spec is not `running` (a bound Spec), naming both; the
    hint says what a spec that differs only by a key gradzip itself adds means: `layers`
    (a format that ran with layers=off, `layers_was_off` says which), `momentum` (folded
    in from the optimizer: `give` is the hint's "give ... the optimizer") or
    `density_warmup` (added with the folded momentum). Specs that differ only in
    `density_warmup` resume alike once every tensor of the checkpoint (`tensors`, its
    named tensors) has made more calls than either warm-up spans, and, with layers=adapt,
    when they differ by a multiple of adapt_every: such a checkpoint is taken."""
    saved_spec = bind_spec(saved)
    if saved_spec == running or _past_both_density_warmups(saved_spec, running, tensors):
        return
    keys, hint = saved_spec.params, ""
    if "layers" in keys and "layers" not in running.params:
        hint = f" (a checkpoint of gradzip's {layers_was_off}: give that spec to resume it as it ran)"
    elif "momentum" in keys and "momentum" not in running.params:
        hint = (f" (its momentum came from the optimizer: {give} the optimizer before loading the "
                "optimizer's state_dict, whose momentum is 0 once folded)")
    elif _differ_only_in_density_warmup(saved_spec, running):
        hint = (" (their density warm-ups differ, and the checkpoint is inside one or chooses layers=adapt's levels "
                f"on another schedule: the optimizer's momentum, folded in at the DDP hook, brings "
                f"density_warmup={HOOK_DENSITY_WARMUP} where the spec sets none; write the saved spec's density_warmup "
                "(0 where it has none) in the spec to resume it as it ran)")
    raise ValueError(f"{door}: the saved state is for {saved!r}, this State runs {str(running)!r}{hint}")


def _differ_only_in_density_warmup(a, b) -> bool:
    """Whether bound specs `a` and `b` name one aggregation and agree on every key but
    density_warmup."""
    def rest(spec):
        return {k: v for k, v in spec.params.items() if k != "density_warmup"}
    return a.name == b.name and rest(a) == rest(b)


def _past_both_density_warmups(saved, running, tensors: dict) -> bool:
    """Whether `saved` and `running` differ only in density_warmup and every tensor's call
    counter is past both warm-ups (`warmup` exact calls, then the longer density warm-up):
    no call to come would take a warm-up codec under either spec. A layers=adapt state
    chooses levels every adapt_every calls counted from the end of the density warm-up,
    so there the two warm-ups must also differ by a multiple of adapt_every. Its spec
    says so (layers=adapt, or auto: every codec with a density warm-up has levels), when
    its state is kept per parameter (keys other than the hook's "bucket:<i>")."""
    if not _differ_only_in_density_warmup(saved, running):
        return False
    saved_warmup, running_warmup = (int(spec.params.get("density_warmup", 0)) for spec in (saved, running))
    per_parameter = any(not key.startswith("bucket:") for key in tensors)
    if per_parameter and saved.params.get("layers", "auto") in ("auto", "adapt"):
        every = int(saved.params.get("adapt_every", _default(saved.name, "adapt_every")))
        if (saved_warmup - running_warmup) % every:
            return False
    span = int(saved.params.get("warmup", 0)) + max(saved_warmup, running_warmup)
    calls = [int(t.reshape(-1)[0]) for key, t in tensors.items() if key.endswith("/calls")]
    return bool(calls) and min(calls) >= span


def _default(name: str, key: str) -> str:
    return next(k["default"] for k in aggregations()[name]["key_details"] if k["name"] == key)


def aggregation_state(state) -> dict:
    """A gradzip.Aggregation checkpoint in this build's format."""
    tensors = state.get("tensors") if isinstance(state, dict) else None
    old = isinstance(tensors, dict) and any(isinstance(v, dict) for v in tensors.values())
    if _format(state, "gradzip.Aggregation", format_0=old) == 0:
        state = {"spec": state["spec"], "tensors": _named_tensors(tensors, state["spec"], "gradzip.Aggregation")}
    _require(state, ("spec", "tensors"), "gradzip.Aggregation")
    return state


def fsdp_state(state) -> dict:
    """A gradzip.fsdp.State checkpoint in this build's format."""
    version = _format(state, "gradzip.fsdp", format_0=False)
    _require(state, ("spec", "state"), "gradzip.fsdp")
    if version < 3:
        state = {**state, "spec": _written_under_layers_off(state["spec"])}
    return state


def format_1_state(state, door: str, fields: tuple) -> dict:
    """A checkpoint of a door that format 1 introduced (DiLoCo, the backend)."""
    _format(state, door, format_0=False)
    _require(state, fields, door)
    return state


def _format(state, door: str, format_0: bool) -> int:
    """The checkpoint's format, checked against what this build reads."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{door}: a checkpoint is a dict (state_dict()), not {type(state).__name__}")
    version = state.get("format")
    if version is None:
        return 0 if format_0 else 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise CheckpointError(f"{door}: the checkpoint's format is {version!r}, not a format number")
    if version > FORMAT:
        raise CheckpointError(f"{door}: the checkpoint is format {version}, written by a newer gradzip; this build "
                              f"reads formats 0 to {FORMAT}: load it with a gradzip that reads format {version}")
    if version == 0 or (format_0 and version >= 1):
        raise CheckpointError(f"{door}: the checkpoint says format {version} but its layout is format "
                              f"{0 if format_0 else 1}'s: it was edited or is not a gradzip state")
    return version


def _require(state: dict, fields: tuple, door: str) -> None:
    missing = [f for f in fields if f not in state]
    if missing:
        raise CheckpointError(f"{door}: the checkpoint lacks {', '.join(missing)}: not a format-{FORMAT} "
                              f"state_dict() of this door")


def _named_tensors(per_key: dict, spec: str, door: str) -> dict:
    """Format 0's {key: {"residual", "calls", "step", "public_copies"}} as the named
    tensors the spec's aggregation keeps: compressed ones a residual and two counters,
    gossip its calls and (CHOCO) public copies, the exact all-reduce nothing."""
    bound = bind_spec(spec)
    out = {}
    for key, s in per_key.items():
        if not isinstance(s, dict) or "calls" not in s or "step" not in s:
            raise CheckpointError(f"{door}: the format-0 state of {key!r} lacks its counters (calls, step)")
        if bound.codec is None and not bound.decentralized:
            continue
        out[f"{key}/calls"] = torch.tensor([int(s["calls"])], dtype=torch.int64)
        if bound.decentralized:
            for rank, copy in (s.get("public_copies") or {}).items():
                out[f"{key}/public_copy_{int(rank)}"] = copy.detach().float().flatten().clone()
            continue
        if s.get("residual") is not None:
            out[f"{key}/residual"] = s["residual"].detach().float().flatten().clone()
        out[f"{key}/step"] = torch.tensor([int(s["step"])], dtype=torch.int64)
    return out
