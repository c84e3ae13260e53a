"""Gossip graphs: who averages with whom in the decentralized aggregations.

    t = gradzip.Topology("exp", 8)
    t.neighbours(0)        # [(1, 0.1667), (2, 0.1667), (4, 0.1667), (6, 0.1667), (7, 0.1667)]
    t.mixing_matrix()      # 8 x 8 float64, symmetric and doubly stochastic
    t.spectral_gap()       # 0.667: the larger, the faster the ranks reach consensus

The graphs (the ``topology`` key of the ``gossip`` and ``choco`` specs): ``ring``,
``torus`` (2-D, for sizes that factor), ``exp`` (i talks to i +- 2^k), ``onepeer`` (one
peer i ^ 2^(t mod log2 n) per step t; n a power of two; exact average after log2 n
steps), ``complete``, and ``explicit`` with ``edges="0-1;1-2;..."``. Weights: ``"mh"``
(Metropolis-Hastings, default) or ``"uniform"`` (1 / (1 + the graph's max degree)).
"""
from typing import Dict, Iterable, List, Tuple

import torch

from ._extension import _C


class Topology:
    """A gossip graph over `size` ranks with its mixing matrix W. Construction checks that
    W is symmetric and doubly stochastic and that the graph is connected (SpecError
    otherwise)."""

    def __init__(self, name: str, size: int, weights: str = "mh", edges: Iterable[Tuple[int, int]] = ()):
        edge_text = edges if isinstance(edges, str) else ";".join(f"{a}-{b}" for a, b in edges)
        self._topology = _C.Topology(name, size, weights, edge_text)

    @classmethod
    def from_neighbour_lists(cls, neighbours: Dict[int, List[int]], weights: str = "mh") -> "Topology":
        """An explicit graph from each rank's neighbour list; the lists must be symmetric."""
        size = len(neighbours)
        if sorted(neighbours) != list(range(size)):
            raise ValueError("gradzip.Topology: give a neighbour list for each rank 0..n-1")
        for rank, peers in neighbours.items():
            for peer in peers:
                if rank not in neighbours.get(peer, ()):
                    raise ValueError(f"gradzip.Topology: rank {rank} lists {peer} as a neighbour but {peer} "
                                     f"does not list {rank}: gossip edges are undirected")
        edges = sorted({(min(r, p), max(r, p)) for r, peers in neighbours.items() for p in peers})
        return cls("explicit", size, weights, edges)

    @property
    def name(self) -> str:
        return self._topology.name

    @property
    def size(self) -> int:
        return self._topology.size

    @property
    def period(self) -> int:
        """Steps after which the graph repeats: 1, or log2 n for onepeer."""
        return self._topology.period

    def neighbours(self, rank: int, step: int = 0) -> List[Tuple[int, float]]:
        """(rank, weight) of each neighbour of `rank` at `step`, ascending, self excluded."""
        return self._topology.neighbours(rank, step)

    def self_weight(self, rank: int, step: int = 0) -> float:
        return self._topology.self_weight(rank, step)

    def mixing_matrix(self, step: int = 0) -> torch.Tensor:
        return self._topology.mixing_matrix(step)

    def consensus_rate(self) -> float:
        """rho = ||P - J/n||_2, P the product of W over one period: the distance to
        consensus shrinks at least by rho per period."""
        return self._topology.consensus_rate()

    def spectral_gap(self) -> float:
        """1 - consensus_rate(); for a static graph 1 - max(|lambda_2|, |lambda_n|) of W."""
        return self._topology.spectral_gap()

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, {self.size}, spectral_gap={self.spectral_gap():.4f})"
