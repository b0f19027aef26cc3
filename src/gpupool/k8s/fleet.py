"""The GPUs of every node the extender knows, as the placement engine's state: fit, why-not,
node scores and GPU choice.

The nodes are one `ClusterState` (scheduler/state.py: rows are nodes, slots GPU indices) and
the policy is the registry's object (scheduler/registry.py), so filter, prioritize and bind
run the code the trace replay measures and the node daemon runs. What pods hold is counted
here (`charge`) and written into the state one node at a time; a node whose inventory changes
makes the state be built again before the next answer. A `low` pod is opportunistic
(scheduler/opportunistic.py): it is answered over a second state where no pod's compute is
counted, and what it holds (its `Charge`) is its memory and no compute. A GPU is advertised to
the kubelet as SLOTS_PER_GPU device slots, so a GPU whose slots are all held takes no pod (its
free room is shown to the engine as none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import NodeSpec
from gpupool.core.units import MILLI_PER_GPU
from gpupool.k8s.hostlist import MAX_EXTENDER_PRIORITY, HostList, Lookup
from gpupool.k8s.inventory import GpuInfo
from gpupool.k8s.names import SLOTS_PER_GPU
from gpupool.k8s.podspec import GpuAsk
from gpupool.scheduler import (
    ClusterState,
    Demand,
    Policy,
    demand_of,
    fragment_index,
    make_policy,
)
from gpupool.scheduler.gpu_placement import Shortfall, never_fits, shortfalls
from gpupool.scheduler.gpus import GpuRequest, GpuView
from gpupool.scheduler.names import DEFAULT_POLICY, check_policy
from gpupool.scheduler.opportunistic import opportunistic
from gpupool.scheduler.packing import share_prices
from gpupool.scheduler.recent import RecentShapes, moved
from gpupool.scheduler.state import GpuSlots
from gpupool.scheduler.workload import TargetWorkload

__all__ = ["DEFAULT_POLICY", "Charge", "Fleet", "check_policy", "gpu_request"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]

#: the GPU indices a node's inventory may use
MAX_GPUS_PER_NODE = 32
#: why a node the extender has no inventory for fails the filter (until a re-read learns it)
UNKNOWN_NODE = "gpupool knows no GPUs on this node"
#: binds between two updates of the target workload the policy scores against (each update
#: makes the fragment index anew over every node)
TARGET_EVERY = 64

#: the filter's passing list is the candidates less those that fail when fewer fail than this
_FEW_FAIL = 64
_NEVER_KEPT = 1 << 16


def gpu_request(ask: GpuAsk) -> GpuRequest:
    """The pod's ask as the node daemon's placement takes a share."""
    models = (ask.gpu_model,) if ask.gpu_model else ()
    if ask.exclusive:
        return GpuRequest.exclusive(ask.gpus, models)
    return GpuRequest(ask.gpus, ask.compute, ask.memory, models)


def priorities(scores: F64) -> I64:
    """Policy scores (any scale, higher better) as the extender API's 0..MAX_EXTENDER_PRIORITY:
    the best candidate MAX, the worst 0, linear between (all MAX when they tie)."""
    if scores.size == 0:
        return np.zeros(0, np.int64)
    low, high = float(scores.min()), float(scores.max())
    if high == low:
        return np.full(scores.size, MAX_EXTENDER_PRIORITY, np.int64)
    scaled: I64 = np.rint((scores - low) / (high - low) * MAX_EXTENDER_PRIORITY).astype(np.int64)
    return scaled


@dataclass(frozen=True)
class Charge:
    """What one pod holds on one node: GPU indices, memory bytes and milli-GPU on each."""

    node: str
    gpus: tuple[int, ...]
    memory: int
    milli: int
    exclusive: bool


class Fleet:
    """Free resources per node and GPU; not thread-safe (the extender locks around it)."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.names: list[str] = []
        self.models: dict[str, int] = {}
        self._inventory: dict[str, tuple[GpuInfo, ...]] = {}
        # (node, slot): what pods hold, summed, and how many pods (device slots) on each GPU
        self._memory_used: I64 = np.zeros((0, 1), np.int64)
        self._milli_used: I64 = np.zeros((0, 1), np.int64)
        self._shares: I64 = np.zeros((0, 1), np.int64)
        self._classes: I64 = np.zeros((0, 2), np.int64)
        #: the state as `high` pods see it and as `low` pods see it (None: to be built)
        self._states: tuple[ClusterState, ClusterState] | None = None
        #: the candidate lists kube-scheduler sends, and each node's HostPriority entries
        self.hosts = HostList()
        self.recent = RecentShapes()
        self._binds = 0
        self._policies: dict[str, Policy] = {}
        self._inventory_memory: I64 = np.zeros((0, 1), np.int64)
        #: never_fits's line per (request, row), until an inventory changes
        self._never_lines: dict[tuple[GpuRequest, int], str] = {}

    # -- candidates ---------------------------------------------------------------------------

    def lookup(self, names: list[str]) -> I64:
        """Row of each name, -1 for a node without inventory."""
        return self.hosts.lookup(names, self.rows).rows

    def _lookup(self, names: list[str]) -> Lookup:
        return self.hosts.lookup(names, self.rows)

    def priority_json(self, names: list[str], scores: I64) -> str:
        """The HostPriorityList as JSON (see HostList.priority_json)."""
        return self.hosts.priority_json(self._lookup(names), names, scores, self.names)

    # -- changes ------------------------------------------------------------------------------

    def set_node(self, name: str, gpus: Sequence[GpuInfo]) -> None:
        """Add a node or replace its inventory; what pods hold on it is kept."""
        if self._inventory.get(name) == tuple(gpus):
            return  # the periodic re-read: nothing to forget
        width = max([gpu.index + 1 for gpu in gpus], default=0)
        if width > MAX_GPUS_PER_NODE:
            raise InvalidRequest(
                f"node {name}: GPU index {width - 1}; gpupool places on nodes of at most "
                f"{MAX_GPUS_PER_NODE} GPUs"
            )
        self._inventory[name] = tuple(gpus)
        for gpu in gpus:
            self.models.setdefault(gpu.model, len(self.models))
        if name not in self.rows:
            self.rows[name] = len(self.names)
            self.names.append(name)
            self.hosts.forget()
        n, g = self._memory_used.shape
        if len(self.names) > n or width > g:
            self._grow(max(width, g), max(len(self.names), 2 * n))
        self._states = None
        self._never_lines.clear()

    def _grow(self, g: int, n: int) -> None:
        for attr in ("_memory_used", "_milli_used", "_shares"):
            old = getattr(self, attr)
            bigger = np.zeros((n, g), np.int64)
            bigger[: old.shape[0], : old.shape[1]] = old
            setattr(self, attr, bigger)
        classes = np.zeros((n, g + 1), np.int64)
        classes[: self._classes.shape[0], : self._classes.shape[1]] = self._classes
        self._classes = classes

    def charge(self, charge: Charge, sign: int = 1) -> None:
        """Take (sign 1) or give back (sign -1) what a pod holds."""
        row = self.rows[charge.node]
        cols = list(charge.gpus)
        self._memory_used[row, cols] += sign * charge.memory
        self._milli_used[row, cols] += sign * charge.milli
        self._shares[row, cols] += sign
        whole = charge.exclusive or charge.milli == MILLI_PER_GPU
        self._classes[row, len(cols) if whole else 0] += sign
        if self._states is not None:
            self._write(row)

    def _write(self, row: int | I64) -> None:
        """The free room of node `row` (or of rows) into both states."""
        assert self._states is not None
        high, low = self._states
        width = high.max_gpus
        full = self._shares[row, :width] >= SLOTS_PER_GPU
        memory = np.where(full, 0, high.gpu_mem_total[row] - self._memory_used[row, :width])
        compute = np.where(full, 0, MILLI_PER_GPU - self._milli_used[row, :width])
        classes = self._classes[row, : width + 1]
        high.set_free(row, compute, memory, classes)
        low.set_free(row, np.where(full, 0, MILLI_PER_GPU), memory, classes)

    def states(self) -> tuple[ClusterState, ClusterState]:
        """The state as high pods and as low pods see it, built if the inventory changed."""
        if self._states is None:
            self._states = (self._build(), self._build())
            self._policies.clear()
            self._write(np.arange(len(self.names)))
        return self._states

    def _build(self) -> ClusterState:
        n = len(self.names)
        width = max(
            1, max((gpu.index + 1 for gpus in self._inventory.values() for gpu in gpus), default=1)
        )
        model = np.full((n, width), -1, np.int64)
        memory = np.zeros((n, width), np.int64)
        healthy = np.zeros((n, width), np.bool_)
        for name, gpus in self._inventory.items():
            row = self.rows[name]
            for gpu in gpus:
                model[row, gpu.index] = self.models[gpu.model]
                memory[row, gpu.index] = gpu.memory
                healthy[row, gpu.index] = gpu.healthy
        #: each GPU's memory as the inventory says, healthy or not (for "never fits")
        self._inventory_memory = memory
        names = tuple(sorted(self.models, key=self.models.__getitem__))
        nodes = [NodeSpec(name, 0, 0, 0) for name in self.names]
        return ClusterState.of_gpus(nodes, GpuSlots(model, memory, healthy, names))

    # -- policy -------------------------------------------------------------------------------

    def policy(self, name: str) -> Policy:
        """The registry's policy `name`, scoring against the recent pods' shapes."""
        found = self._policies.get(name)
        if found is None:
            self.states()
            found = make_policy(name, seed=0, target_workload=self.recent.target())
            self._policies[name] = found
        return found

    def bound(self, ask: GpuAsk) -> None:
        """A pod of this ask was bound: weigh its shape into the target workload. Every
        TARGET_EVERY binds the policies take the new target up, if it moved (`moved`: a
        probability by more than TARGET_MOVED): the fragment index is then made anew over
        every node, which a steady workload should not pay for."""
        self.recent.add(gpu_request(ask))
        self._binds += 1
        if self._binds % TARGET_EVERY or not self._moved(self.recent.target()):
            return
        used = list(self._policies)
        for state in self._states or ():
            state.drop_observers()
        self._policies.clear()
        # made now, in bind, rather than by the next prioritize, whose answer is awaited
        target = self.recent.target()
        share_prices(target)
        for name in used:
            self.policy(name)
            for state in self.states():
                fragment_index(state, target)

    def _moved(self, target: TargetWorkload) -> bool:
        for policy in self._policies.values():
            used = getattr(policy, "target", None)
            if isinstance(used, TargetWorkload) and moved(used, target):
                return True
        return False

    # -- one pod's answers --------------------------------------------------------------------

    def _state(self, ask: GpuAsk) -> ClusterState:
        high, low = self.states()
        return low if opportunistic(ask.priority) else high

    def _never(self, request: GpuRequest, rows: I64) -> Bool:
        """For these rows: the pod could not fit even on the idle node (too few GPUs, of the
        model, with the memory)."""
        state = self.states()[0]
        demand = demand_of(request)
        present = state.present[rows]
        allowed = present
        if demand.gpu_models:
            ids = [self.models[m] for m in demand.gpu_models if m in self.models]
            allowed = present & np.isin(state.gpu_model[rows], ids)
        total = self._inventory_memory[rows]
        need = demand.memory_on(total) if demand.asks_memory else np.zeros_like(total)
        k = demand.gpus
        never: Bool = (
            (present.sum(axis=1) < k)
            | (allowed.sum(axis=1) < k)
            | ((allowed & (need <= total)).sum(axis=1) < k)
        )
        return never

    def filter(
        self, ask: GpuAsk, names: list[str]
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """The nodes where the pod fits now; why each other one does not now (the shortfall of
        GPUs); why each never could (gpu_placement.never_fits)."""
        found = self._lookup(names)
        request = gpu_request(ask)
        fits = self._fits(ask, found)
        if fits.all():
            return list(names), {}, {}
        failing = np.flatnonzero(~fits)
        rows = found.rows[failing]
        known = rows >= 0
        never = np.zeros(len(failing), np.bool_)
        if known.any():
            never[known] = self._never(request, rows[known])
        able = np.zeros(len(failing), np.int64)
        if known.any():
            fits_now = self._state(ask).gpu_fits(demand_of(request), rows[known])
            able[known] = fits_now.sum(axis=1)
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for i, row, never_here, count in zip(
            failing.tolist(), rows.tolist(), never.tolist(), able.tolist(), strict=True
        ):
            if row < 0:
                unresolvable[names[i]] = UNKNOWN_NODE
            elif never_here:
                unresolvable[names[i]] = self.never_fits(ask, row)
            else:
                failed[names[i]] = str(Shortfall(-1, "gpus", request.gpus, count))
        kept = np.flatnonzero(fits)
        if len(failing) < _FEW_FAIL:  # cheaper than a list of 10,000 names picked one by one
            fit = list(names)
            for i in reversed(failing.tolist()):
                del fit[i]
        else:
            fit = [names[i] for i in kept.tolist()]
        # kube-scheduler sends prioritize these names: their rows are known already
        self.hosts.remember(Lookup(list(fit), found.rows[kept]))
        return fit, failed, unresolvable

    def _fits(self, ask: GpuAsk, found: Lookup) -> Bool:
        """Per candidate: known, and the pod fits there now (judged on the candidates only)."""
        rows = np.where(found.known, found.rows, 0)
        feasible = self._state(ask).feasible(demand_of(gpu_request(ask)), rows)
        fits: Bool = found.known & feasible
        return fits

    def never_fits(self, ask: GpuAsk, row: int) -> str:
        """gpu_placement.never_fits's line for a node the pod never fits (kept per shape and
        node until an inventory changes: a pod no node takes is asked about again and again)."""
        key = (gpu_request(ask), row)
        if key not in self._never_lines:
            if len(self._never_lines) >= _NEVER_KEPT:
                self._never_lines.clear()
            reason = never_fits(key[0], self.gpu_views(self.names[row]))
            self._never_lines[key] = reason or "the pod never fits this node"
        return self._never_lines[key]

    def node_scores(self, ask: GpuAsk, names: list[str], policy: str) -> tuple[Bool, F64]:
        """Per node: the pod fits now, and the policy's score (meaningless where it does not
        fit; higher is better)."""
        found = self._lookup(names)
        fits = self._fits(ask, found)
        scores = np.zeros(len(names), np.float64)
        rows = found.rows[fits]
        if rows.size:
            chooser = self.policy(policy)
            demand = demand_of(gpu_request(ask))
            scores[fits] = chooser.scores(self._state(ask), demand, rows).astype(np.float64)
        return fits, scores

    def scores(self, ask: GpuAsk, names: list[str], policy: str) -> I64:
        """0..MAX_EXTENDER_PRIORITY per node (0 where the pod does not fit)."""
        fits, scores = self.node_scores(ask, names, policy)
        result = np.zeros(len(names), np.int64)
        result[fits] = priorities(scores[fits])
        return result

    # -- one node, for bind ---------------------------------------------------------------------

    def gpu_views(self, node: str) -> list[GpuView]:
        """`node`'s GPUs as the node daemon's placement sees them (what pods hold deducted; a
        GPU whose device slots are all held as not healthy)."""
        row = self.rows.get(node)
        if row is None:
            raise InvalidRequest(f"node {node}: gpupool knows no GPU inventory for it")
        views = []
        for gpu in self._inventory[node]:
            i = gpu.index
            memory = int(np.clip(gpu.memory - self._memory_used[row, i], 0, gpu.memory))
            compute = int(np.clip(MILLI_PER_GPU - self._milli_used[row, i], 0, MILLI_PER_GPU))
            usable = gpu.healthy and gpu.memory > 0 and self._shares[row, i] < SLOTS_PER_GPU
            views.append(GpuView(i, gpu.model, gpu.memory, memory, compute, usable))
        return views

    def choose(self, ask: GpuAsk, node: str, policy: str) -> tuple[int, ...]:
        """The GPU indices the pod takes on `node`: the policy's choice on the engine's state,
        the one the node daemon makes, so a pod lands on the GPUs a `gpupool submit` would."""
        row = self.rows.get(node)
        if row is None:
            raise InvalidRequest(f"node {node}: gpupool knows no GPU inventory for it")
        request = gpu_request(ask)
        demand: Demand = demand_of(request)
        state = self._state(ask)
        if not state.feasible(demand)[row]:
            views = self.gpu_views(node)
            if opportunistic(ask.priority):
                views = [
                    GpuView(
                        v.index, v.model, v.memory_total, v.memory_free, MILLI_PER_GPU, v.healthy
                    )
                    for v in views
                ]
            why = "; ".join(str(s) for s in shortfalls(request, views))
            raise InvalidRequest(f"node {node}: {why}")
        return self.policy(policy).gpus_on(state, demand, row).gpus

    def memory_of(self, ask: GpuAsk, node: str, gpus: Sequence[int]) -> int:
        """Bytes the pod holds on each of its GPUs (the smallest GPU's share when proportional)."""
        request = gpu_request(ask)
        views = {view.index: view for view in self.gpu_views(node)}
        return min(request.memory_on(views[g]) for g in gpus)
