"""Which ranks of a process group share a node: the layout behind the hierarchical
exchange (docs/spec.md, "Exchanges"), and the node and lane transports made from it."""
import logging
import os
import secrets
import socket

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def node_layout(store, rank: int, size: int) -> list[list[int]]:
    """The group's ranks by node: lists of group ranks in rank order, the nodes in the
    order of their lowest rank. GRADZIP_NODE_SIZE=L (tests and benchmarks on one
    machine) makes ranks [k·L, (k+1)·L) node k; otherwise every rank publishes its
    node's identity in the group's store (node_identity()) and ranks with the same
    identity share a node."""
    forced = forced_layout(size)
    if forced is not None:
        return forced
    store.set(f"gradzip/host/{rank}", node_identity())
    keys = [f"gradzip/host/{r}" for r in range(size)]
    hosts = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(k) for k in keys]
    return layout_of([bytes(host) for host in hosts])


def forced_layout(size: int):
    """The layout GRADZIP_NODE_SIZE asks for, or None when it is not set."""
    forced = os.environ.get("GRADZIP_NODE_SIZE")
    if not forced:
        return None
    if not forced.isdigit() or int(forced) < 1 or size % int(forced) != 0:
        raise ValueError(f"gradzip: GRADZIP_NODE_SIZE={forced!r} must be a whole number of ranks that divides "
                         f"the group's {size}")
    per_node = int(forced)
    return [list(range(k * per_node, (k + 1) * per_node)) for k in range(size // per_node)]


def layout_of(identities: list) -> list[list[int]]:
    """Ranks grouped by their node identities, the nodes in the order of their lowest rank."""
    nodes: dict = {}
    for r, identity in enumerate(identities):
        nodes.setdefault(identity, []).append(r)
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
    of different sizes are logged). make(name, members, index) creates the transport of
    the group ranks `members` (this rank at `index` among them), named `name`: every
    member calls it with the same name and members."""
    sizes = {len(ranks) for ranks in layout}
    if len(layout) < 2 or max(sizes) < 2:
        return None
    if len(sizes) > 1:
        logger.warning("gradzip: the group's nodes hold different numbers of ranks (%s); its exchange stays flat",
                       sorted(len(ranks) for ranks in layout))
        return None
    node = next(k for k, ranks in enumerate(layout) if rank in ranks)
    local = layout[node].index(rank)
    return (make(f"node{node}", layout[node], local), make(f"lane{local}", [ranks[local] for ranks in layout], node))


def layout_ranks(layout: list[list[int]]) -> list[int]:
    """The group rank of each (node, local rank), node by node: NodeLevels' `ranks`."""
    return [rank for ranks in layout for rank in ranks]


def gloo_maker(store, timeout):
    """make() for node_transports: Gloo groups under the group's store."""
    return lambda name, members, index: dist.ProcessGroupGloo(
        dist.PrefixStore(f"gradzip/gloo/{name}/", store), index, len(members), timeout)


def shared_memory_wanted() -> bool:
    """Whether the node's CPU stages use shared memory: GRADZIP_NODE_SHARED_MEMORY=0 keeps
    them on Gloo (a small /dev/shm)."""
    return os.environ.get("GRADZIP_NODE_SHARED_MEMORY", "1") != "0"


def new_shared_memory_name() -> str:
    """A fresh POSIX shared-memory name, made by a node's first rank for the whole node."""
    return f"/gradzip-{os.getpid()}-{secrets.token_hex(8)}"


def shared_memory_name(store, layout: list[list[int]], rank: int, purpose: str = "node") -> str:
    """A POSIX shared-memory name for this rank's node, the same on all its ranks:
    the node's first rank makes it and publishes it in the group's store (under
    `purpose`, so that two uses in one group never read each other's)."""
    node = next(k for k, ranks in enumerate(layout) if rank in ranks)
    key = f"gradzip/shm/{purpose}{node}"
    if layout[node][0] == rank:
        store.set(key, new_shared_memory_name())
    return bytes(store.get(key)).decode()


def group_node_levels(group):
    """(node, lane, ranks, shared-memory name) made of torch.distributed Gloo groups for this
    rank of `group` (None: the default group), for the doors that run an aggregation of
    their own (the DDP hook, gradzip.Aggregation); None where the layout has no hierarchy
    to use. Collective over `group`: node identities are all-gathered, then each rank
    makes its node's and its lane's groups with the ranks in them alone."""
    group = group if group is not None else dist.group.WORLD
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    layout = forced_layout(size)
    if layout is None:
        identities = [None] * size
        dist.all_gather_object(identities, node_identity(), group=group)
        layout = layout_of(identities)

    def make(_name, members, _index):
        return dist.new_group([dist.get_global_rank(group, r) for r in members], backend="gloo",
                              use_local_synchronization=True)

    groups = node_transports(layout, rank, make)
    if groups is None:
        return None
    node_group, lane_group = groups
    node = next(k for k, ranks in enumerate(layout) if rank in ranks)
    name = [new_shared_memory_name() if layout[node][0] == rank else None]
    dist.broadcast_object_list(name, src=dist.get_global_rank(group, layout[node][0]), group=node_group)
    cpu = torch.device("cpu")
    return node_group._get_backend(cpu), lane_group._get_backend(cpu), layout_ranks(layout), name[0]
