"""The Policy interface and what every policy shares: node scores, GPU choice, node order."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import numpy.typing as npt

from gpupool.scheduler.demand import Demand
from gpupool.scheduler.state import ClusterState, Placement
from gpupool.scheduler.types import IntArray

Scores = npt.NDArray[np.generic]


class Policy(ABC):
    """Scores the feasible nodes, takes the best, then chooses GPUs on it. Ties go to the node
    that comes first in a random permutation of the nodes fixed by the seed (the paper's node
    order). The same object answers the replay (`choose`), the extender's prioritize
    (`scores`) and bind (`gpus_on`), and the node daemon (`choose` on its one node)."""

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

    def best_index(self, state: ClusterState, nodes: IntArray, scores: Scores) -> int:
        """Position in `nodes` of the highest score; ties go to node order."""
        tied = np.flatnonzero(scores == scores.max())
        if tied.size == 1:
            return int(tied[0])
        rank = self.node_rank(state.n_nodes)[nodes[tied]]
        return int(tied[np.argmin(rank)])

    @abstractmethod
    def scores(self, state: ClusterState, demand: Demand, nodes: IntArray) -> Scores:
        """A score per node of `nodes` (feasible for `demand`; higher is better)."""

    def gpus_on(self, state: ClusterState, demand: Demand, node: int) -> Placement:
        """The GPUs `demand` takes on `node` (feasible): the fullest that fit, by default."""
        return state.best_gpu_placement(node, demand)

    def choose(self, state: ClusterState, demand: Demand, feasible: IntArray) -> Placement:
        """A placement on one of `feasible` (non-empty node indices where `demand` fits)."""
        at = self.best_index(state, feasible, self.scores(state, demand, feasible))
        return self.gpus_on(state, demand, int(feasible[at]))
