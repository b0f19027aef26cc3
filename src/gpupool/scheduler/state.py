"""Cluster state as numpy arrays over nodes x GPUs: free resources, feasibility, GPU choice.

One state serves every entry point: the trace replay builds it from the trace's nodes, the node
daemon from its one node's GPUs (one row), the Kubernetes extender from every node it knows.
Per GPU it holds free compute (milli), memory (bytes), model and health; per node, free CPU and
host memory. The trace's nodes are one model each with no GPU memory asked: `simple` states and
memoryless demands take column-wise shortcuts that give the same answers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

import numpy as np

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.demand import Demand, demand_of
from gpupool.scheduler.gpus import GpuRequest
from gpupool.scheduler.types import BoolArray, FloatArray, IntArray

__all__ = ["BoolArray", "ClusterState", "FloatArray", "IntArray", "Placement"]

#: value of an absent (or unusable) GPU slot in the free-compute array
NO_GPU = -1
#: class of a pod for clustering: 0 = a fractional share, k = k whole GPUs
SHARE_CLASS = 0
#: GPU memory of a trace node, whose GPUs' memory no pod asks for
UNBOUNDED_MEMORY = 1 << 50

Asked = Request | GpuRequest | Demand


class NodeObserver(Protocol):
    """A cache derived from the state (the fragment index), told of each node that changed."""

    def refresh_node(self, node: int) -> None:
        """Node `node`'s free resources changed: recompute what depends on them."""


_Observer = TypeVar("_Observer", bound=NodeObserver)


@dataclass(frozen=True)
class Placement:
    """Where a demand goes: a node index, the GPU slots on it, and milli taken on each GPU."""

    node: int
    gpus: tuple[int, ...]
    milli: int


def pod_class(demand: Demand) -> int:
    """Clustering class of a GPU demand: 0 for a fractional share, else its GPU count."""
    return SHARE_CLASS if demand.is_fractional else demand.gpus


@dataclass(frozen=True)
class GpuSlots:
    """What the GPUs of a set of nodes are: (nodes, slots) arrays; `model` -1 for no GPU."""

    model: IntArray
    memory: IntArray
    healthy: BoolArray
    model_names: tuple[str, ...]


class ClusterState:
    """Free resources of every node, updated in place (allocate/release, or set_free)."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        if not nodes:
            raise InvalidRequest("invalid cluster: no nodes")
        width = max(1, max(node.gpu_count for node in nodes))
        names = tuple(sorted({node.gpu_model for node in nodes}))
        index = {name: i for i, name in enumerate(names)}
        count = np.array([x.gpu_count for x in nodes], np.int64)
        present = np.arange(width)[None, :] < count[:, None]
        model = np.where(present, np.array([index[x.gpu_model] for x in nodes])[:, None], -1)
        memory = np.array([x.gpu_memory or UNBOUNDED_MEMORY for x in nodes], np.int64)
        slots = GpuSlots(
            model.astype(np.int64), np.where(present, memory[:, None], 0), present.copy(), names
        )
        self._setup(tuple(nodes), slots)

    @classmethod
    def of_gpus(cls, nodes: Sequence[NodeSpec], slots: GpuSlots) -> ClusterState:
        """A state whose GPUs are given slot by slot (a live node: models, memory, health
        per GPU); `nodes` give CPU and host memory (gpu_count and gpu_model are ignored)."""
        state = cls.__new__(cls)
        state._setup(tuple(nodes), slots)
        return state

    def _setup(self, nodes: tuple[NodeSpec, ...], slots: GpuSlots) -> None:
        self.nodes = nodes
        n, width = slots.model.shape
        self.max_gpus = max(1, width)
        self.model_names = slots.model_names
        self.gpu_model: IntArray = slots.model
        self.present: BoolArray = slots.model >= 0
        self.usable: BoolArray = self.present & slots.healthy & (slots.memory > 0)
        first = np.argmax(self.present, axis=1)
        self.model_id: IntArray = np.where(
            self.present.any(axis=1), slots.model[np.arange(n), first], -1
        ).astype(np.int64)
        #: every GPU usable and of its node's model: feasibility by column shortcuts
        self.simple = bool(
            (self.usable == self.present).all()
            and (
                np.where(self.present, slots.model, -1)
                == np.where(self.present, self.model_id[:, None], -1)
            ).all()
        )
        self.gpu_count: IntArray = self.present.sum(axis=1).astype(np.int64)
        self.cpu_capacity: IntArray = np.array([x.cpu for x in nodes], np.int64)
        self.mem_capacity: IntArray = np.array([x.host_memory for x in nodes], np.int64)
        self.cpu_free: IntArray = self.cpu_capacity.copy()
        self.mem_free: IntArray = self.mem_capacity.copy()
        self.gpu_mem_total: IntArray = np.where(self.usable, slots.memory, 0).astype(np.int64)
        self.gpu_mem_free: IntArray = self.gpu_mem_total.copy()
        self.gpu_free: IntArray = np.where(self.usable, MILLI_PER_GPU, NO_GPU).astype(np.int64)
        self.gpu_capacity: IntArray = self.usable.sum(axis=1).astype(np.int64) * MILLI_PER_GPU
        self.gpu_free_total: IntArray = self.gpu_capacity.copy()
        self.full_free: IntArray = self.usable.sum(axis=1).astype(np.int64)
        self.max_free: IntArray = self.gpu_free.max(axis=1)
        # pods per (node, class); the class axis holds shares (0) and 1..max_gpus whole GPUs
        self.class_pods: IntArray = np.zeros((n, self.max_gpus + 1), np.int64)
        #: per node, how many classes it holds pods of (nonzero entries of class_pods' row)
        self.classes_held: IntArray = np.zeros(n, np.int64)
        self.total_gpu_milli = int(self.gpu_capacity.sum())
        self._observers: dict[Hashable, NodeObserver] = {}
        self._model_masks: dict[tuple[str, ...], tuple[BoolArray, BoolArray]] = {}

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def allocated_gpu_milli(self) -> int:
        return self.total_gpu_milli - int(self.gpu_free_total.sum())

    # -- feasibility and GPU choice ---------------------------------------------------------

    def model_mask(self, models: Sequence[str]) -> BoolArray:
        """Nodes whose (first) GPU model is one of `models` (all nodes when `models` is empty)."""
        if not models:
            return np.ones(self.n_nodes, np.bool_)
        return self._allowed(models)[0]

    def _model_ids(self, models: Sequence[str]) -> IntArray:
        return np.array([i for i, name in enumerate(self.model_names) if name in models], np.int64)

    def _allowed(self, models: Sequence[str]) -> tuple[BoolArray, BoolArray]:
        """(nodes whose first GPU is one of `models`, (nodes, slots) GPUs of one of them),
        kept per model list: models never change, and pods repeat a few lists."""
        key = tuple(models)
        found = self._model_masks.get(key)
        if found is None:
            ids = self._model_ids(models)
            found = self._model_masks[key] = (
                np.isin(self.model_id, ids),
                np.isin(self.gpu_model, ids),
            )
        return found

    def gpu_fits(self, demand: Demand, rows: IntArray | slice = slice(None)) -> BoolArray:
        """(rows, slots): the GPUs that can take one GPU of `demand` now."""
        ok: BoolArray = self.gpu_free[rows] >= demand.compute
        if demand.gpu_models:
            ok &= self._allowed(demand.gpu_models)[1][rows]
        if demand.asks_memory:
            ok &= self.gpu_mem_free[rows] >= demand.memory_on(self.gpu_mem_total[rows])
        return ok

    def feasible(self, request: Asked, rows: IntArray | slice = slice(None)) -> BoolArray:
        """Nodes (all, or `rows`) where the demand fits now (CPU, host memory, GPU model,
        compute, memory)."""
        demand = demand_of(request)
        ok = (self.cpu_free[rows] >= demand.cpu) & (self.mem_free[rows] >= demand.host_memory)
        if demand.gpus == 0:
            return ok
        if self.simple and not demand.asks_memory:
            if demand.gpu_models:
                ok &= self._allowed(demand.gpu_models)[0][rows]
            if demand.compute == MILLI_PER_GPU:
                return ok & (self.full_free[rows] >= demand.gpus)
            if demand.gpus == 1:
                return ok & (self.max_free[rows] >= demand.compute)
        count = self.gpu_fits(demand, rows).sum(axis=1)
        result: BoolArray = ok & (count >= demand.gpus)
        return result

    def fitting_gpus(self, node: int, request: Asked) -> IntArray:
        """Slots of the GPUs on `node` that can take one GPU of the demand now."""
        return np.flatnonzero(self.gpu_fits(demand_of(request), np.array([node]))[0])

    def ordered_gpus(self, node: int, request: Asked, *, emptiest: bool = False) -> IntArray:
        """The fitting GPUs of `node`, fullest first (least free compute, then memory, then
        slot), or emptiest first."""
        fits = self.fitting_gpus(node, request)
        compute, memory = self.gpu_free[node, fits], self.gpu_mem_free[node, fits]
        keys = (-compute, -memory) if emptiest else (compute, memory)
        order = np.lexsort((fits, keys[1], keys[0]))
        result: IntArray = fits[order]
        return result

    def best_gpu_placement(self, node: int, request: Asked) -> Placement:
        """The paper's GPU choice: the fullest GPUs that fit (least free milli, lowest slot on
        ties); completely free GPUs by slot for whole GPUs; none for CPU-only."""
        demand = demand_of(request)
        if self.simple and not demand.asks_memory and demand.gpus and not demand.gpu_models:
            # the trace's shapes (memory is the same on every GPU, the node feasible)
            # in plain Python: a node has a few GPUs, and this runs once per placed pod
            free = self.gpu_free[node].tolist()
            if demand.compute == MILLI_PER_GPU:
                whole = [g for g, milli in enumerate(free) if milli == MILLI_PER_GPU]
                return Placement(node, tuple(whole[: demand.gpus]), MILLI_PER_GPU)
            if demand.gpus == 1:
                fits = [(milli, g) for g, milli in enumerate(free) if milli >= demand.compute]
                return Placement(node, (min(fits, default=(0, 0))[1],), demand.compute)
        return self.gpus_in_order(node, demand, emptiest=False)

    def gpus_in_order(self, node: int, request: Asked, *, emptiest: bool) -> Placement:
        """The first GPUs of `ordered_gpus` (as many as the demand asks)."""
        demand = demand_of(request)
        if demand.gpus == 0:
            return Placement(node, (), 0)
        chosen = self.ordered_gpus(node, demand, emptiest=emptiest)[: demand.gpus]
        return Placement(node, tuple(sorted(int(g) for g in chosen)), demand.compute)

    # -- incremental updates ------------------------------------------------------------------

    def allocate(self, request: Asked, placement: Placement) -> None:
        """Take the demand's resources on `placement`; InvalidRequest (state unchanged) if they
        are not free."""
        demand = demand_of(request)
        self._check(demand, placement)
        n, gpus = placement.node, list(placement.gpus)
        for gpu in placement.gpus:
            if self.gpu_free[n, gpu] < placement.milli:
                raise InvalidRequest(f"invalid placement: GPU {gpu} of node {n} lacks milli")
        memory: IntArray | int = 0
        if demand.asks_memory:
            memory = demand.memory_on(self.gpu_mem_total[n, gpus])
            if (self.gpu_mem_free[n, gpus] < memory).any():
                raise InvalidRequest(f"invalid placement: a GPU of node {n} lacks memory")
        if self.cpu_free[n] < demand.cpu or self.mem_free[n] < demand.host_memory:
            raise InvalidRequest(f"invalid placement: node {n} lacks CPU or host memory")
        self._apply(demand, placement, memory, sign=-1)

    def release(self, request: Asked, placement: Placement) -> None:
        """Give back what `allocate(request, placement)` took."""
        demand = demand_of(request)
        self._check(demand, placement)
        n, gpus = placement.node, list(placement.gpus)
        for gpu in placement.gpus:
            if self.gpu_free[n, gpu] + placement.milli > MILLI_PER_GPU:
                raise InvalidRequest(f"invalid release: GPU {gpu} of node {n} is not that used")
        memory: IntArray | int = 0
        if demand.asks_memory:
            memory = demand.memory_on(self.gpu_mem_total[n, gpus])
            if (self.gpu_mem_free[n, gpus] + memory > self.gpu_mem_total[n, gpus]).any():
                raise InvalidRequest(f"invalid release: a GPU of node {n} has not that memory")
        cls = pod_class(demand)
        if demand.gpus and self.class_pods[n, cls] == 0:
            raise InvalidRequest(f"invalid release: node {n} holds no pod of that kind")
        if (
            self.cpu_free[n] + demand.cpu > self.cpu_capacity[n]
            or self.mem_free[n] + demand.host_memory > self.mem_capacity[n]
        ):
            raise InvalidRequest(f"invalid release: node {n} has not that much CPU or memory used")
        self._apply(demand, placement, memory, sign=+1)

    def _check(self, demand: Demand, placement: Placement) -> None:
        n = placement.node
        if not 0 <= n < self.n_nodes:
            raise InvalidRequest(f"invalid placement: node {n} out of range 0..{self.n_nodes - 1}")
        if len(placement.gpus) != demand.gpus or len(set(placement.gpus)) != demand.gpus:
            raise InvalidRequest(
                f"invalid placement: {placement.gpus} for a request of {demand.gpus} GPUs"
            )
        if demand.gpus and placement.milli != demand.compute:
            raise InvalidRequest(f"invalid placement: milli {placement.milli} != request compute")
        for gpu in placement.gpus:
            if not (0 <= gpu < self.max_gpus and self.usable[n, gpu]):
                raise InvalidRequest(f"invalid placement: node {n} has no GPU {gpu}")

    def _apply(
        self, demand: Demand, placement: Placement, memory: IntArray | int, *, sign: int
    ) -> None:
        n = placement.node
        self.cpu_free[n] += sign * demand.cpu
        self.mem_free[n] += sign * demand.host_memory
        if placement.gpus:
            # element by element: cheaper than fancy indexing for a pod's few GPUs
            for gpu in placement.gpus:
                self.gpu_free[n, gpu] += sign * placement.milli
            if demand.asks_memory:
                self.gpu_mem_free[n, list(placement.gpus)] += sign * memory
            cls = pod_class(demand)
            self.class_pods[n, cls] -= sign
            held = self.class_pods[n, cls]
            if held == 0 or (held == 1 and sign < 0):  # the class left, or came
                self.classes_held[n] -= sign
            self._derive_one(n)
        for observer in self._observers.values():
            observer.refresh_node(n)

    def set_free(
        self, nodes: int | IntArray, compute: IntArray, memory: IntArray, classes: IntArray
    ) -> None:
        """Set the free compute and memory per slot and the pods per class of a node (or of
        rows `nodes`, arrays one row each): a live cache that counts what pods hold itself.
        Unusable slots stay unusable."""
        usable = self.usable[nodes]
        self.gpu_free[nodes] = np.where(usable, np.clip(compute, 0, MILLI_PER_GPU), NO_GPU)
        total = self.gpu_mem_total[nodes]
        self.gpu_mem_free[nodes] = np.where(usable, np.clip(memory, 0, total), 0)
        self.class_pods[nodes] = classes
        self.classes_held[nodes] = np.count_nonzero(self.class_pods[nodes], axis=-1)
        self._derive(nodes)
        for observer in self._observers.values():
            for node in np.atleast_1d(nodes).tolist():
                observer.refresh_node(node)

    def _derive_one(self, n: int) -> None:
        """`_derive` of one node, in plain Python over its few slots (same values)."""
        row = self.gpu_free[n].tolist()
        self.gpu_free_total[n] = sum(free for free in row if free > 0)
        self.full_free[n] = row.count(MILLI_PER_GPU)
        self.max_free[n] = max(row)

    def _derive(self, n: int | IntArray) -> None:
        rows = self.gpu_free[n]
        self.gpu_free_total[n] = np.where(rows > 0, rows, 0).sum(axis=-1)
        self.full_free[n] = np.count_nonzero(rows == MILLI_PER_GPU, axis=-1)
        self.max_free[n] = rows.max(axis=-1)

    # -- derived caches ----------------------------------------------------------------------

    def drop_observers(self) -> None:
        """Forget every derived cache (their inputs changed, e.g. a new target workload)."""
        self._observers.clear()

    def observer(self, key: Hashable, make: Callable[[], _Observer]) -> _Observer:
        """The observer registered under `key`, made by `make()` and registered the first time;
        from then on every change refreshes it for each changed node."""
        found = self._observers.get(key)
        if found is None:
            found = self._observers[key] = make()
        # a key is only ever registered by one `make`, so the type it made is the type asked for
        return cast(_Observer, found)
