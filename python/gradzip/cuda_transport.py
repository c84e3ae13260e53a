"""Which transport carries a gradzip group's CUDA tensors: NCCL, or the group's host
transport (Gloo, or MPI under mpirun) through host buffers (gradzip._C.HostStagedBackend).

NCCL refuses two ranks on one GPU, so where ranks share a GPU ("host") their CUDA tensors,
compressed payloads and exact collectives alike, are copied to pinned host memory, moved
by the host transport, and copied back. That is also the way for a torch without NCCL.
The choice, in order: ``Options(cuda_transport=...)``, ``$GRADZIP_CUDA_TRANSPORT``, else
"auto": when the group is made, its ranks all-gather their node, the GPUs they can see and
the GPU init_process_group(device_id=...) bound them to; a group takes "host" when two of
its ranks are bound to one GPU, or, where some rank is not bound, when a node holds more
ranks than the GPUs its ranks can see between them; else "nccl". Rank 0 logs the choice.
Ranks that are not bound and pick one GPU of a node that has enough for all (two ranks on
cuda:0 of a two-GPU node) are not seen: NCCL refuses them at its first call; ask for
"host" there, or bind them (init_process_group(device_id=...)).
"""
import hashlib
import logging
import os

import torch
import torch.distributed as dist

from .node_layout import node_identity

logger = logging.getLogger(__name__)

CHOICES = ("auto", "nccl", "host")


def requested(option) -> str:
    """The choice asked for: `option`, else $GRADZIP_CUDA_TRANSPORT, else "auto"."""
    value = option if option is not None else os.environ.get("GRADZIP_CUDA_TRANSPORT", "auto")
    value = str(value).strip().lower()
    if value not in CHOICES:
        raise ValueError(f"gradzip: cuda_transport (or GRADZIP_CUDA_TRANSPORT) must be one of {', '.join(CHOICES)}, "
                         f"not {value!r}")
    return value


def _gpu_id(index: int) -> str:
    """A short name of GPU `index` that is the same in every process that sees it: a digest
    of its UUID (CUDA_VISIBLE_DEVICES renumbers GPUs per process; UUIDs stay)."""
    return hashlib.sha256(str(torch.cuda.get_device_properties(index).uuid).encode()).hexdigest()[:12]


def describe_rank(asked: str, bound) -> str:
    """This rank's entry in the group's all-gather: what it asked for (requested(), or why
    that failed); where CUDA is available, whether torch has NCCL (1 or 0); and where
    "auto" has a choice to make, its node, the GPU it is bound to (or -) and the GPUs it
    sees. A rank whose GPUs cannot be read sends why, as what it asked for: the others
    then fail with it instead of waiting."""
    asked = asked.replace("|", "/")
    if not torch.cuda.is_available():
        return asked
    nccl = "1" if dist.is_nccl_available() else "0"
    if asked != "auto" or nccl == "0":
        return f"{asked}|{nccl}"  # nothing to decide: no GPU properties read (they initialize CUDA)
    try:
        visible = sorted({_gpu_id(i) for i in range(torch.cuda.device_count())})
        bound_id = _gpu_id(bound.index if bound.index is not None else torch.cuda.current_device()) if bound else "-"
        return "|".join([asked, nccl, node_identity(), bound_id, ",".join(visible)])
    except Exception as error:  # noqa: B902 - whatever it is, every rank must hear of it
        return f"its GPUs could not be read ({error})".replace("|", "/")


def require_one_request(entries: list[str]) -> None:
    """Raises ValueError, naming each side, unless every rank's describe_rank() asked for
    the same (a rank whose request was invalid sent why)."""
    asked: dict = {}
    for rank, entry in enumerate(entries):
        asked.setdefault(entry.split("|")[0], []).append(rank)
    if len(asked) > 1:
        named = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {value}"
                          for value, r in asked.items())
        raise ValueError(f"gradzip: the ranks of this group asked for different CUDA transports ({named}); give every "
                         f"rank the same Options(cuda_transport=...) or GRADZIP_CUDA_TRANSPORT: {', '.join(CHOICES)}")


def decide(entries: list[str]) -> tuple[str, str]:
    """("nccl" or "host", why) from every rank's describe_rank() under "auto" with NCCL
    everywhere (ranks without CUDA take no part)."""
    parsed = [(rank, *fields[2:]) for rank, fields in enumerate(e.split("|") for e in entries) if len(fields) == 5]
    if all(bound != "-" for _, _, bound, _ in parsed):
        owners: dict = {}
        for rank, node, bound, _ in parsed:
            owners.setdefault((node, bound), []).append(rank)
        shared = [ranks for ranks in owners.values() if len(ranks) > 1]
        if shared:
            return "host", f"ranks {', '.join(map(str, shared[0]))} are bound to one GPU"
        return "nccl", "every rank is bound to a GPU of its own"
    nodes: dict = {}
    for rank, node, _, visible in parsed:
        ranks, gpus = nodes.setdefault(node, ([], set()))
        ranks.append(rank)
        gpus.update(g for g in visible.split(",") if g)
    for node, (ranks, gpus) in nodes.items():
        if len(ranks) > len(gpus):
            return "host", (f"node {node} holds {len(ranks)} ranks ({', '.join(map(str, ranks))}) and its ranks see "
                            f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} between them")
    return "nccl", "no node holds more ranks than the GPUs its ranks see"


def choose(asked: str, entries: list[str], rank: int) -> str:
    """"nccl" or "host" for this rank (CUDA available) of a group being made: `asked`
    (requested(), the same on every rank), or with "auto" decide() over every rank's
    describe_rank(); the same on every rank, from the same entries. Rank 0 logs it."""
    unread = [entry for entry in entries if entry.split("|")[0] != asked]
    if unread:  # every rank failed alike (require_one_request raised where they differ)
        raise ValueError(f"gradzip: the CUDA transport cannot be chosen: {unread[0]}")
    without_nccl = [r for r, entry in enumerate(entries) if entry.split("|")[1:2] == ["0"]]
    lacking = f"the torch of rank{'s' * (len(without_nccl) > 1)} {', '.join(map(str, without_nccl))} has no NCCL"
    if asked == "nccl" and without_nccl:
        raise ValueError(f"gradzip: cuda_transport 'nccl' was asked for, but {lacking}")
    if asked != "auto":
        choice, why = asked, "asked for"
    elif without_nccl:
        choice, why = "host", lacking
    else:
        choice, why = decide(entries)
    if rank == 0:
        carrier = "NCCL" if choice == "nccl" else "the host transport through pinned host memory"
        log = logger.warning if choice == "host" and asked == "auto" else logger.info
        log("gradzip: this group's CUDA tensors travel over %s (%s); Options(cuda_transport=...) or "
            "GRADZIP_CUDA_TRANSPORT=nccl|host chooses", carrier, why)
    return choice
