"""Cluster state as numpy arrays: free resources per node and GPU, feasibility, GPU choice."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

import numpy as np
import numpy.typing as npt

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import MILLI_PER_GPU

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

#: value of an absent GPU slot in the padded (nodes, max_gpus) array
NO_GPU = -1
#: class of a pod for clustering: 0 = a fractional share, k = k whole GPUs
SHARE_CLASS = 0


class NodeObserver(Protocol):
    """A cache derived from the state (the fragment index), told of each node that changed."""

    def refresh_node(self, node: int) -> None:
        """Node `node`'s free resources changed: recompute what depends on them."""


_Observer = TypeVar("_Observer", bound=NodeObserver)


@dataclass(frozen=True)
class Placement:
    """Where a request goes: a node index, the GPU indices on it, and milli taken on each GPU."""

    node: int
    gpus: tuple[int, ...]
    milli: int


def pod_class(request: Request) -> int:
    """Clustering class of a GPU request: 0 for a fractional share, else its GPU count."""
    return SHARE_CLASS if request.is_fractional else request.gpus


class ClusterState:
    """Free resources of every node, updated in place by allocate/release (one node per call).

    GPUs live in an (N, max_gpus) array of free milli, padded with NO_GPU, so that whole-cluster
    scoring is a handful of array operations. Derived per-node columns (free GPU total, fully free
    GPU count, largest free GPU) are kept up to date so feasibility is O(N) vector work.
    """

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        if not nodes:
            raise InvalidRequest("invalid cluster: no nodes")
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        n = len(self.nodes)
        self.max_gpus = max(1, max(node.gpu_count for node in self.nodes))
        self.model_names: tuple[str, ...] = tuple(sorted({node.gpu_model for node in self.nodes}))
        model_index = {name: i for i, name in enumerate(self.model_names)}
        self.model_id: IntArray = np.array([model_index[x.gpu_model] for x in self.nodes], np.int64)
        self.gpu_count: IntArray = np.array([x.gpu_count for x in self.nodes], np.int64)
        self.cpu_capacity: IntArray = np.array([x.cpu for x in self.nodes], np.int64)
        self.mem_capacity: IntArray = np.array([x.host_memory for x in self.nodes], np.int64)
        self.gpu_capacity: IntArray = self.gpu_count * MILLI_PER_GPU
        slots = np.arange(self.max_gpus)[None, :] < self.gpu_count[:, None]
        self.cpu_free: IntArray = self.cpu_capacity.copy()
        self.mem_free: IntArray = self.mem_capacity.copy()
        self.gpu_free: IntArray = np.where(slots, MILLI_PER_GPU, NO_GPU).astype(np.int64)
        self.gpu_free_total: IntArray = self.gpu_capacity.copy()
        self.full_free: IntArray = self.gpu_count.copy()
        self.max_free: IntArray = np.where(self.gpu_count > 0, MILLI_PER_GPU, NO_GPU)
        # pods per (node, class); the class axis holds shares (0) and 1..max_gpus whole GPUs
        self.class_pods: IntArray = np.zeros((n, self.max_gpus + 1), np.int64)
        self.total_gpu_milli = int(self.gpu_capacity.sum())
        self._observers: dict[Hashable, NodeObserver] = {}

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def allocated_gpu_milli(self) -> int:
        return self.total_gpu_milli - int(self.gpu_free_total.sum())

    # -- feasibility and GPU choice ---------------------------------------------------------

    def model_mask(self, models: Sequence[str]) -> BoolArray:
        """Nodes whose GPU model is one of `models` (all nodes when `models` is empty)."""
        if not models:
            return np.ones(self.n_nodes, np.bool_)
        ids = [i for i, name in enumerate(self.model_names) if name in models]
        return np.isin(self.model_id, np.array(ids, np.int64))

    def feasible(self, request: Request) -> BoolArray:
        """Nodes where `request` fits now (CPU, host memory, GPU model, GPU capacity)."""
        ok = (self.cpu_free >= request.cpu) & (self.mem_free >= request.host_memory)
        if request.gpus == 0:
            return ok
        ok &= self.model_mask(request.gpu_models)
        if request.is_fractional:
            return ok & (self.max_free >= request.compute)
        return ok & (self.full_free >= request.gpus)

    def fitting_gpus(self, node: int, request: Request) -> IntArray:
        """Indices of the GPUs on `node` with at least the request's per-GPU milli free."""
        return np.flatnonzero(self.gpu_free[node] >= request.compute)

    def best_gpu_placement(self, node: int, request: Request) -> Placement:
        """The paper's GPU choice: least free milli that still fits (lowest index on ties) for a
        share; the first completely free GPUs by index for whole GPUs; none for CPU-only."""
        if request.gpus == 0:
            return Placement(node, (), 0)
        if not request.is_fractional:
            return self.whole_gpu_placement(node, request)
        free = self.gpu_free[node]
        masked = np.where(free >= request.compute, free, np.iinfo(np.int64).max)
        return Placement(node, (int(np.argmin(masked)),), request.compute)

    def whole_gpu_placement(self, node: int, request: Request) -> Placement:
        """The first `request.gpus` completely free GPUs of `node`, by index."""
        free = np.flatnonzero(self.gpu_free[node] == MILLI_PER_GPU)[: request.gpus]
        return Placement(node, tuple(int(g) for g in free), MILLI_PER_GPU)

    # -- incremental updates ------------------------------------------------------------------

    def allocate(self, request: Request, placement: Placement) -> None:
        """Take `request`'s resources on `placement`; InvalidRequest (state unchanged) if they
        are not free."""
        self._check(request, placement)
        n = placement.node
        for gpu in placement.gpus:
            if self.gpu_free[n, gpu] < placement.milli:
                raise InvalidRequest(f"invalid placement: GPU {gpu} of node {n} lacks milli")
        if self.cpu_free[n] < request.cpu or self.mem_free[n] < request.host_memory:
            raise InvalidRequest(f"invalid placement: node {n} lacks CPU or host memory")
        self._apply(request, placement, sign=-1)

    def release(self, request: Request, placement: Placement) -> None:
        """Give back what `allocate(request, placement)` took."""
        self._check(request, placement)
        n = placement.node
        for gpu in placement.gpus:
            if self.gpu_free[n, gpu] + placement.milli > MILLI_PER_GPU:
                raise InvalidRequest(f"invalid release: GPU {gpu} of node {n} is not that used")
        cls = pod_class(request)
        if request.gpus and self.class_pods[n, cls] == 0:
            raise InvalidRequest(f"invalid release: node {n} holds no pod of that kind")
        if (
            self.cpu_free[n] + request.cpu > self.cpu_capacity[n]
            or self.mem_free[n] + request.host_memory > self.mem_capacity[n]
        ):
            raise InvalidRequest(f"invalid release: node {n} has not that much CPU or memory used")
        self._apply(request, placement, sign=+1)

    def _check(self, request: Request, placement: Placement) -> None:
        n = placement.node
        if not 0 <= n < self.n_nodes:
            raise InvalidRequest(f"invalid placement: node {n} out of range 0..{self.n_nodes - 1}")
        if len(placement.gpus) != request.gpus or len(set(placement.gpus)) != request.gpus:
            raise InvalidRequest(
                f"invalid placement: {placement.gpus} for a request of {request.gpus} GPUs"
            )
        if request.gpus and placement.milli != request.compute:
            raise InvalidRequest(f"invalid placement: milli {placement.milli} != request compute")
        for gpu in placement.gpus:
            if not 0 <= gpu < self.gpu_count[n]:
                raise InvalidRequest(f"invalid placement: node {n} has no GPU {gpu}")

    def _apply(self, request: Request, placement: Placement, *, sign: int) -> None:
        n = placement.node
        self.cpu_free[n] += sign * request.cpu
        self.mem_free[n] += sign * request.host_memory
        if placement.gpus:
            self.gpu_free[n, list(placement.gpus)] += sign * placement.milli
            row = self.gpu_free[n]
            self.gpu_free_total[n] = int(row[row > 0].sum())
            self.full_free[n] = int(np.count_nonzero(row == MILLI_PER_GPU))
            self.max_free[n] = int(row.max())
            self.class_pods[n, pod_class(request)] -= sign
        for observer in self._observers.values():
            observer.refresh_node(n)

    # -- derived caches ----------------------------------------------------------------------

    def observer(self, key: Hashable, make: Callable[[], _Observer]) -> _Observer:
        """The observer registered under `key`, made by `make()` and registered the first time;
        from then on allocate/release refresh it for each changed node."""
        found = self._observers.get(key)
        if found is None:
            found = self._observers[key] = make()
        # a key is only ever registered by one `make`, so the type it made is the type asked for
        return cast(_Observer, found)
