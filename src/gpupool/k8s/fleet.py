"""The GPUs of every node the extender knows, as arrays: fit, why-not, score, GPU choice.

One row per node, one column per GPU slot (padded). Filtering and scoring a pod over 10,000
nodes is then a few vector operations, which keeps the extender's answer within milliseconds.
Policies, as the trace simulator names them: `binpack` fills the fullest node and GPU, `spread`
the emptiest; `gpupool` takes the fullest GPU that fits (best fit) and, between nodes, prefers
one where the pod does not break into a whole free GPU, so whole GPUs stay whole for the pods
that need them (the fragmentation the trace policy measures).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MILLI_PER_GPU, format_bytes
from gpupool.k8s.inventory import GpuInfo
from gpupool.k8s.names import SLOTS_PER_GPU
from gpupool.k8s.podspec import GpuAsk
from gpupool.scheduler.gpu_placement import place
from gpupool.scheduler.gpus import GpuRequest, GpuView

I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]
F64 = npt.NDArray[np.float64]

POLICIES = ("gpupool", "binpack", "spread")
DEFAULT_POLICY = "gpupool"
#: the kube-scheduler extender API's top score (k8s.io/kube-scheduler/extender/v1)
MAX_EXTENDER_PRIORITY = 10


#: the target workload of the gpupool policy, milli-GPU of one-GPU shapes, equally likely: a
#: quarter, a half, a whole GPU (scheduler/'s default for the node daemon)
FRAGMENT_TARGET = (250, 500, MILLI_PER_GPU)
_LOOKUPS_KEPT = 4
#: the growth of a GPU where the pod does not fit: above any real one
_NO_FIT = np.iinfo(np.int64).max // 4
_SCORE_TAILS = np.array([f"{s}}}" for s in range(MAX_EXTENDER_PRIORITY + 1)], dtype=object)


def _host_head(name: str) -> str:
    return f'{{"host":{json.dumps(name)},"score":'


def gpu_request(ask: GpuAsk) -> GpuRequest:
    """The pod's ask as the node daemon's placement takes a share."""
    models = (ask.gpu_model,) if ask.gpu_model else ()
    if ask.exclusive:
        return GpuRequest.exclusive(ask.gpus, models)
    return GpuRequest(ask.gpus, ask.compute, ask.memory, models)


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise InvalidRequest(f"unknown policy {name!r}; valid policies: {', '.join(POLICIES)}")
    return name


@dataclass
class _Lookup:
    """A candidate list, its rows, and (once asked for) its HostPriorityList fragments."""

    names: list[str]
    rows: I64
    heads: npt.NDArray[Any] | None = None
    #: the last fitting-GPU matrix: (ask, fleet version, matrix); filter and prioritize of one
    #: pod ask the same question of the same fleet
    fitting: tuple[GpuAsk, int, Bool] | None = None
    #: (fleet version, fragment per GPU now): the same for every pod until something changes
    fragment: tuple[int, I64] | None = None


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
        #: `{"host":"NAME","score":` per row, for the HostPriorityList
        self._host_json: list[str] = []
        #: recent candidate lists and their rows (filter's list, then prioritize's shorter one)
        self._lookups: list[_Lookup] = []
        #: bumped on every change, so that cached answers know when they are stale
        self.version = 0
        #: bumped when a node's GPUs change (not what pods hold)
        self._inventory = 0
        self._shape_memory_cache: tuple[int, list[I64]] | None = None
        self._alloc(0, 1)

    def lookup(self, names: list[str]) -> I64:
        """Row of each name, -1 for a node without inventory."""
        return self._lookup(names).rows

    def _lookup(self, names: list[str]) -> _Lookup:
        """The rows of a candidate list.

        kube-scheduler sends the same candidate lists cycle after cycle: recent answers are kept
        (comparing two lists of strings is far cheaper than 10,000 dict look-ups).
        """
        for known in self._lookups:
            if len(known.names) == len(names) and known.names == names:
                return known
        try:
            rows = np.array([self.rows.get(n, -1) for n in names], np.int64)
        except TypeError as err:  # a name that is a list or an object
            raise InvalidRequest(f"invalid node names: {err}") from err
        found = _Lookup(list(names), rows)
        self._lookups = [found, *self._lookups[: _LOOKUPS_KEPT - 1]]
        return found

    def _pick(self, array: npt.NDArray[Any], rows: I64) -> npt.NDArray[Any]:
        """array[rows], without a copy when rows are all nodes in order (the common case)."""
        n = len(self.names)
        everything = len(rows) == n and n > 0 and rows[0] == 0 and rows[-1] == n - 1
        if everything and np.array_equal(rows, np.arange(n)):
            return array[:n]
        picked: npt.NDArray[Any] = array[rows]
        return picked

    def _alloc(self, n: int, g: int) -> None:
        self.mem_total: I64 = np.zeros((n, g), np.int64)
        self.mem_used: I64 = np.zeros((n, g), np.int64)
        self.milli_used: I64 = np.zeros((n, g), np.int64)
        self.shares: I64 = np.zeros((n, g), np.int64)
        self.usable: Bool = np.zeros((n, g), np.bool_)
        self.present: Bool = np.zeros((n, g), np.bool_)
        self.model: I64 = np.full((n, g), -1, np.int64)

    def _grow(self, n: int, g: int) -> None:
        old = (self.mem_total, self.mem_used, self.milli_used, self.shares)
        flags, model = (self.usable, self.present), self.model
        on, og = self.mem_total.shape
        self._alloc(max(n, on), max(g, og))
        for new, prev in zip(
            (self.mem_total, self.mem_used, self.milli_used, self.shares), old, strict=True
        ):
            new[:on, :og] = prev
        self.usable[:on, :og], self.present[:on, :og] = flags
        self.model[:on, :og] = model

    def set_node(self, name: str, gpus: Sequence[GpuInfo]) -> None:
        """Add a node or replace its inventory; what pods hold on it is kept."""
        row = self.rows.get(name)
        if row is None:
            row = len(self.names)
            self.rows[name] = row
            self.names.append(name)
            self._host_json.append(_host_head(name))
            self._lookups.clear()
        self.version += 1
        self._inventory += 1
        n, g = self.mem_total.shape
        width = max([gpu.index + 1 for gpu in gpus], default=0)
        if row >= n or width > g:
            self._grow(max(row + 1, 2 * n), width)
        self.present[row] = False
        self.usable[row] = False
        for gpu in gpus:
            model = self.models.setdefault(gpu.model, len(self.models))
            self.present[row, gpu.index] = True
            self.usable[row, gpu.index] = gpu.healthy and gpu.memory > 0
            self.mem_total[row, gpu.index] = gpu.memory
            self.model[row, gpu.index] = model

    def charge(self, charge: Charge, sign: int = 1) -> None:
        """Take (sign 1) or give back (sign -1) what a pod holds."""
        row = self.rows[charge.node]
        cols = list(charge.gpus)
        self.mem_used[row, cols] += sign * charge.memory
        self.milli_used[row, cols] += sign * charge.milli
        self.shares[row, cols] += sign
        self.version += 1

    def _need_memory(self, ask: GpuAsk, rows: I64) -> I64:
        total = self._pick(self.mem_total, rows)
        if ask.exclusive:
            return total
        if ask.memory is not None:
            return np.full_like(total, ask.memory)
        return total * ask.compute // MILLI_PER_GPU

    def _model_ok(self, ask: GpuAsk, rows: I64) -> Bool | bool:
        if ask.gpu_model is None:
            return True
        model = self.models.get(ask.gpu_model, -2)
        ok: Bool = self._pick(self.model, rows) == model
        return ok

    def fitting_gpus(self, ask: GpuAsk, rows: I64) -> Bool:
        """(rows, slots): the GPUs where one GPU of the ask fits now."""
        free_mem = self._pick(self.mem_total, rows) - self._pick(self.mem_used, rows)
        ok: Bool = self._pick(self.usable, rows) & (free_mem >= self._need_memory(ask, rows))
        ok &= self._pick(self.milli_used, rows) <= MILLI_PER_GPU - ask.compute
        ok &= self._model_ok(ask, rows)
        shares = self._pick(self.shares, rows)
        ok &= shares == 0 if ask.exclusive else shares < SLOTS_PER_GPU
        return ok

    def _fitting(self, ask: GpuAsk, found: _Lookup) -> Bool:
        cached = found.fitting
        if cached is not None and cached[0] == ask and cached[1] == self.version:
            return cached[2]
        ok = self.fitting_gpus(ask, np.where(found.rows >= 0, found.rows, 0))
        found.fitting = (ask, self.version, ok)
        return ok

    def fits(self, ask: GpuAsk, names: list[str]) -> Bool:
        """Per name: the pod fits the node now (False for a node without inventory)."""
        found = self._lookup(names)
        fits: Bool = (found.rows >= 0) & (self._fitting(ask, found).sum(axis=1) >= ask.gpus)
        return fits

    def filter(self, ask: GpuAsk, names: list[str]) -> tuple[list[str], dict[str, str]]:
        """The nodes where the pod fits, and why each other one does not."""
        rows = self.lookup(names)
        fits = self.fits(ask, names)
        failed = {}
        for i in np.flatnonzero(~fits).tolist():
            row = int(rows[i])
            failed[names[i]] = (
                self.why_not(ask, row) if row >= 0 else "gpupool knows no GPUs on this node"
            )
        if not failed:
            return list(names), failed
        return [names[i] for i in np.flatnonzero(fits).tolist()], failed

    def never_fits(self, ask: GpuAsk, row: int) -> str | None:
        """Why the pod could not fit the node even when empty; None when it could."""
        present = self.usable[row]
        count = int(present.sum())
        if count < ask.gpus:
            return f"the node has {count} usable GPU(s), the pod asks for {ask.gpus}"
        if ask.memory is not None:
            largest = int(self.mem_total[row][present].max())
            if ask.memory > largest:
                return (
                    f"the pod asks for {format_bytes(ask.memory)} per GPU, the node's largest "
                    f"GPU has {format_bytes(largest)}"
                )
        if ask.gpu_model is not None and ask.gpu_model not in self._models_of(row):
            return f"the node has no {ask.gpu_model} GPU"
        return None

    def _models_of(self, row: int) -> set[str]:
        ids = set(self.model[row][self.present[row]].tolist())
        return {name for name, i in self.models.items() if i in ids}

    def why_not(self, ask: GpuAsk, row: int) -> str:
        never = self.never_fits(ask, row)
        if never is not None:
            return never
        free = int(self.fitting_gpus(ask, np.array([row], np.int64)).sum())
        return f"{free} of its GPUs have room for {ask.describe()}, the pod needs {ask.gpus}"

    def scores(self, ask: GpuAsk, names: list[str], policy: str) -> I64:
        """0..MAX_EXTENDER_PRIORITY per node (0 where the pod does not fit)."""
        found = self._lookup(names)
        rows = np.where(found.rows >= 0, found.rows, 0)
        ok = self._fitting(ask, found)
        fits = (ok.sum(axis=1) >= ask.gpus) & (found.rows >= 0)
        if policy == "gpupool":
            raw = self._gpupool_scores(ask, rows, ok, found)
        else:
            raw = self._usage_after(ask, rows)
            if policy == "spread":
                raw = 1.0 - raw
        scaled = np.rint(np.clip(raw, 0.0, 1.0) * MAX_EXTENDER_PRIORITY).astype(np.int64)
        result: I64 = np.where(fits, scaled, 0)
        return result

    def priority_json(self, names: list[str], scores: I64) -> str:
        """The HostPriorityList as JSON, from per-row fragments (10,000 entries in about 1 ms)."""
        found = self._lookup(names)
        if found.heads is None:
            found.heads = np.array(
                [
                    self._host_json[r] if r >= 0 else _host_head(n)
                    for r, n in zip(found.rows.tolist(), names, strict=True)
                ],
                dtype=object,
            )
        heads = found.heads
        entries: list[str] = (heads + _SCORE_TAILS[scores]).tolist()
        return "[" + ",".join(entries) + "]"

    def _usage_after(self, ask: GpuAsk, rows: I64) -> F64:
        """How full each node is after the pod: the mean over its GPUs of used compute and
        memory fractions (the node score of scheduler/'s binpack, scaled to 0..1)."""
        present = self._pick(self.present, rows)
        count = np.maximum(present.sum(axis=1), 1)
        total = self._pick(self.mem_total, rows)
        memory = np.where(present, self._pick(self.mem_used, rows) / np.maximum(total, 1), 0)
        compute = np.where(present, self._pick(self.milli_used, rows) / MILLI_PER_GPU, 0)
        need = self._need_memory(ask, rows)[:, 0] / np.maximum(total[:, 0], 1)
        added = ask.gpus * (ask.compute / MILLI_PER_GPU + need)
        usage: F64 = ((compute + memory).sum(axis=1) + added) / (2 * count)
        return usage

    def _shape_memory(self, rows: I64) -> list[I64]:
        """Per target shape, the memory it needs on each GPU (its share of the GPU's memory)."""
        cache = self._shape_memory_cache
        if cache is None or cache[0] != self._inventory:
            cache = (
                self._inventory,
                [self.mem_total * c // MILLI_PER_GPU for c in FRAGMENT_TARGET],
            )
            self._shape_memory_cache = cache
        return [self._pick(need, rows) for need in cache[1]]

    def _fragment(self, rows: I64) -> I64:
        """Per GPU, the compute the target shapes cannot use on it, summed over the shapes."""
        usable = self._pick(self.usable, rows)
        compute_free = MILLI_PER_GPU - self._pick(self.milli_used, rows)
        memory_free = self._pick(self.mem_total, rows) - self._pick(self.mem_used, rows)
        lost = np.zeros(compute_free.shape, np.int64)
        for compute, memory in zip(FRAGMENT_TARGET, self._shape_memory(rows), strict=True):
            held = usable & (compute_free >= compute) & (memory_free >= memory)
            lost += np.where(held, 0, compute_free)
        return lost

    def _fragment_now(self, found: _Lookup) -> I64:
        """`_fragment` of the candidates, the same for every pod until something changes."""
        if found.fragment is None or found.fragment[0] != self.version:
            found.fragment = (
                self.version,
                self._fragment(np.where(found.rows >= 0, found.rows, 0)),
            )
        return found.fragment[1]

    def _growth(self, ask: GpuAsk, rows: I64, ok: Bool, now: I64) -> I64:
        """Per GPU, how much the fragment grows if one GPU of the pod goes there (a GPU's
        fragment depends on that GPU alone); a huge value where the pod does not fit."""
        usable = self._pick(self.usable, rows)
        compute_after = MILLI_PER_GPU - self._pick(self.milli_used, rows) - ask.compute
        memory_free = self._pick(self.mem_total, rows) - self._pick(self.mem_used, rows)
        memory_after = memory_free - self._need_memory(ask, rows)
        growth = -now
        for compute, memory in zip(FRAGMENT_TARGET, self._shape_memory(rows), strict=True):
            held_after = usable & (compute_after >= compute) & (memory_after >= memory)
            growth += np.where(held_after, 0, compute_after)
        result: I64 = np.where(ok, growth, _NO_FIT)
        return result

    def _gpupool_scores(self, ask: GpuAsk, rows: I64, ok: Bool, found: _Lookup) -> F64:
        """scheduler/'s gpupool node score, vectorised: 50 + 50 x (fragment removed) / (compute
        taken), the pod on the k GPUs whose fragment grows least, scaled to 0..1."""
        growth = self._growth(ask, rows, ok, self._fragment_now(found))
        k = min(ask.gpus, int(ok.shape[1]))
        least = growth.min(axis=1) if k == 1 else np.partition(growth, k - 1, axis=1)[:, :k].sum(1)
        removed = -least / len(FRAGMENT_TARGET)
        score: F64 = np.clip(50 + 50 * removed / (ask.compute * ask.gpus), 0, 100) / 100
        return score

    def gpu_views(self, node: str) -> list[GpuView]:
        """`node`'s GPUs as the node daemon's placement sees them (what pods hold deducted)."""
        row = self.rows.get(node)
        if row is None:
            raise InvalidRequest(f"node {node}: gpupool knows no GPU inventory for it")
        model_names = {number: name for name, number in self.models.items()}
        views = []
        for g in np.flatnonzero(self.present[row]):
            total = int(self.mem_total[row, g])
            free = min(total, max(0, total - int(self.mem_used[row, g])))
            compute = min(MILLI_PER_GPU, max(0, MILLI_PER_GPU - int(self.milli_used[row, g])))
            model = model_names[int(self.model[row, g])]
            views.append(GpuView(int(g), model, total, free, compute, bool(self.usable[row, g])))
        return views

    def choose(self, ask: GpuAsk, node: str, policy: str) -> tuple[int, ...]:
        """The GPU indices the pod takes on `node`: scheduler/gpu_placement's choice, the one the
        node daemon makes, so a pod lands on the GPUs a `gpupool submit` of it would get."""
        placement = place(gpu_request(ask), self.gpu_views(node), policy)
        if placement.gpus is None:
            raise InvalidRequest(f"node {node}: {self.why_not(ask, self.rows[node])}")
        return placement.gpus

    def memory_of(self, ask: GpuAsk, node: str, gpus: Sequence[int]) -> int:
        """Bytes the pod holds on each of its GPUs (the smallest GPU's share when proportional)."""
        row = self.rows[node]
        need = self._need_memory(ask, np.array([row], np.int64))[0]
        return int(min(int(need[g]) for g in gpus))

    def overcommitted(self) -> list[tuple[str, int]]:
        """(node, GPU) pairs holding more than the GPU has: must stay empty."""
        over = (self.milli_used > MILLI_PER_GPU) | (self.mem_used > self.mem_total)
        return [(self.names[r], int(g)) for r, g in zip(*np.nonzero(over), strict=True)]
