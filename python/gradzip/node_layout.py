"""Which ranks of a process group share a node: the layout behind the hierarchical
exchange (docs/spec.md, "Exchanges"), and the node and lane transports made from it."""
import logging
import os
import secrets
import socket

import torch.distributed as dist

logger = logging.getLogger(__name__)


def node_layout(store, rank: int, size: int) -> list[list[int]]:
    """The group's ranks by node: lists of group ranks in rank order, the nodes in the
    order of their lowest rank. GRADZIP_NODE_SIZE=L (tests and benchmarks on one
    machine) makes ranks [k·L, (k+1)·L) node k; otherwise every rank publishes its
    node's identity in the group's store (node_identity()) and ranks with the same
    identity share a node."""
    forced = os.environ.get("GRADZIP_NODE_SIZE")
    if forced:
        if not forced.isdigit() or int(forced) < 1 or size % int(forced) != 0:
            raise ValueError(f"gradzip: GRADZIP_NODE_SIZE={forced!r} must be a whole number of ranks that divides "
                             f"the group's {size}")
        per_node = int(forced)
        return [list(range(k * per_node, (k + 1) * per_node)) for k in range(size // per_node)]
    store.set(f"gradzip/host/{rank}", node_identity())
    keys = [f"gradzip/host/{r}" for r in range(size)]
    hosts = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(k) for k in keys]
    nodes: dict[bytes, list[int]] = {}
    for r, host in enumerate(hosts):
        nodes.setdefault(bytes(host), []).append(r)
    return sorted(nodes.values(), key=lambda ranks: ranks[0])


def node_identity() -> str:
    """The host name, with the node index the launcher gives where it gives one
    (torchrun's GROUP_RANK, SLURM's SLURM_NODEID): nodes that share a host name (network
    namespaces, containers) stay apart."""
    index = os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", ""))
    return f"{socket.gethostname()}/{index}"


def node_transports(layout: list[list[int]], rank: int, make):
    """(node, lane) transports for this rank of a layout of several nodes of several ranks
    each, all of one size, or None for any other layout (the exchange stays flat; nodes
    of different sizes are logged). make(prefix, rank, size) creates one transport under
    its own store prefix: every rank of a node or lane calls it with the same prefix."""
    sizes = {len(ranks) for ranks in layout}
    if len(layout) < 2 or max(sizes) < 2:
        return None
    if len(sizes) > 1:
        logger.warning("gradzip: the group's nodes hold different numbers of ranks (%s); its exchange stays flat",
                       sorted(len(ranks) for ranks in layout))
        return None
    node = next(k for k, ranks in enumerate(layout) if rank in ranks)
    local = layout[node].index(rank)
    return (make(f"node{node}", local, len(layout[node])), make(f"lane{local}", node, len(layout)))


def gloo_maker(store, timeout):
    """make() for node_transports: Gloo groups under the group's store."""
    return lambda name, rank, size: dist.ProcessGroupGloo(
        dist.PrefixStore(f"gradzip/gloo/{name}/", store), rank, size, timeout)


def shared_memory_name(store, layout: list[list[int]], rank: int) -> str:
    """A POSIX shared-memory name for this rank's node, the same on all its ranks:
    the node's first rank makes it and publishes it in the group's store."""
    node = next(k for k, ranks in enumerate(layout) if rank in ranks)
    key = f"gradzip/shm/node{node}"
    if layout[node][0] == rank:
        store.set(key, f"/gradzip-{os.getpid()}-{secrets.token_hex(8)}")
    return bytes(store.get(key)).decode()
