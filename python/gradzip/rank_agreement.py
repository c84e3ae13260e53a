"""Ranks configured differently, or resumed from different points, are stopped before any
payload moves. When a gradzip group is made (and at the first call of a hook State, a
gradzip.Aggregation or the FSDP door's State), its ranks all-gather what each was configured
with (the aggregation spec, gradzip's release, the payload format) and every rank raises the
same error, naming each side, if they differ: a rank given another spec (GRADZIP_AGGREGATION
set differently on one node) would otherwise decode the others' payloads as garbage, or make
Gloo abort the process on a size mismatch. One all-gather of 512 bytes per rank, once per
group. Those three doors then compare where each rank is in its state (its counters; the
hook's iteration), again at the first call after a load_state_dict() or a new process group:
a rank back from an older checkpoint than the others would compress at another density or
choose its layers' levels at other calls, and the ranks would wait for each other for ever.
"""
import hashlib
from importlib import metadata

import torch

from ._extension import _C

_WIDTH = 512


def describe(spec_text: str) -> str:
    """What a rank must agree on: its spec (or why it has none), gradzip's release and payload format."""
    try:
        release = metadata.version("gradzip")
    except metadata.PackageNotFoundError:
        release = "unknown"
    return f"{spec_text}, gradzip {release}, payload format {_C.WIRE_VERSION}"


def _fixed(text: str) -> torch.Tensor:
    data = text.encode()
    if len(data) > _WIDTH:  # a long spec keeps its start and a digest of the whole
        digest = hashlib.sha256(data).hexdigest()[:16].encode()
        data = data[: _WIDTH - len(digest) - 5] + b" ... " + digest
    out = torch.zeros(_WIDTH, dtype=torch.uint8)
    if data:
        out[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


_CONFIGURED = ("the ranks of this group were configured differently, and it refuses to start before any payload "
               "moves", "give every rank the same GRADZIP_AGGREGATION (or pg_options) and the same gradzip build")
_RESUMED = ("the ranks of this group are not at the same point of their aggregation's state, and it refuses to go on "
           "before any payload moves", "resume every rank from the same checkpoint (a rank's own state_dict() of "
           "the same step, or one state_dict(portable=True)), or none")


def gathered_texts(transport, size: int, texts: list[str], device=None) -> list[list[str]]:
    """Every rank's `texts` (the same number on every rank, each up to 512 bytes; a longer
    one keeps its start and a digest of the whole), by rank: one all-gather over `transport`
    (a c10d Backend of the group's ranks, moving `device` tensors; default CPU)."""
    mine = torch.cat([_fixed(text) for text in texts]).to(device or "cpu")
    every = [torch.empty_like(mine) for _ in range(size)]
    transport.allgather([every], [mine]).wait()
    return [[bytes(field.cpu().numpy()).rstrip(b"\0").decode(errors="replace") for field in row.split(_WIDTH)]
            for row in every]


def require_same(said: list[str], problem=_CONFIGURED) -> None:
    """Raises ValueError, naming which ranks said what, unless every rank (by index) said
    the same. `problem`: what a difference means and what to do about it (default: ranks
    configured differently; _RESUMED: ranks resumed from different points)."""
    if len(set(said)) == 1:
        return
    sides = {}
    for rank, text in enumerate(said):
        sides.setdefault(text, []).append(rank)
    named = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {text}" for text, r in sides.items())
    raise ValueError(f"gradzip: {problem[0]} ({named}); {problem[1]}")


def require_agreement(transport, size: int, description: str, device=None, problem=_CONFIGURED) -> None:
    """All-gathers `description` over `transport` (gathered_texts) and raises ValueError on
    every rank unless all are equal (require_same)."""
    require_same([texts[0] for texts in gathered_texts(transport, size, [description], device)], problem)


def require_same_start(transport, size: int, spec, position: str, device=None) -> None:
    """The check a door makes at its first call, and at its first after a load or a new group:
    its ranks run the same spec (configured alike), then from the same `position` (where each is
    in its state: counters_digest() of it, and the hook's iteration)."""
    require_agreement(transport, size, describe(f"spec '{spec}'"), device)
    require_agreement(transport, size, position, device, _RESUMED)
