"""The Policy interface and what every policy shares: per-seed node order for ties."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import numpy.typing as npt

from gpupool.core.resources import Request
from gpupool.scheduler.state import ClusterState, IntArray, Placement


class Policy(ABC):
    """Chooses a placement among feasible nodes. Ties go to the node that comes first in a
    random permutation of the nodes fixed by the seed (the paper's node order)."""

    name: str = ""

    def __init__(self, *, seed: int) -> None:
        self.seed = seed
        self._rank: IntArray | None = None

    def node_rank(self, n_nodes: int) -> IntArray:
        """rank[i] = position of node i in this seed's node order (lower goes first)."""
        if self._rank is None or self._rank.size != n_nodes:
            order = np.random.default_rng(self.seed).permutation(n_nodes)
            rank = np.empty(n_nodes, np.int64)
            rank[order] = np.arange(n_nodes)
            self._rank = rank
        return self._rank

    def best_index(
        self, state: ClusterState, nodes: IntArray, scores: npt.NDArray[np.generic]
    ) -> int:
        """Position in `nodes` of the highest score; ties go to node order."""
        tied = np.flatnonzero(scores == scores.max())
        if tied.size == 1:
            return int(tied[0])
        rank = self.node_rank(state.n_nodes)[nodes[tied]]
        return int(tied[np.argmin(rank)])

    @abstractmethod
    def choose(self, state: ClusterState, request: Request, feasible: IntArray) -> Placement:
        """A placement on one of `feasible` (non-empty node indices where `request` fits)."""
