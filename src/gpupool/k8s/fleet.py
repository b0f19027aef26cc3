"""The GPUs of every node the extender knows, as arrays: fit, why-not, score, GPU choice.

One row per node, one column per GPU slot (padded). Filtering and scoring a pod over 10,000
nodes is then a few vector operations, which keeps the extender's answer within milliseconds.
Policies, as the trace simulator names them: `binpack` fills the fullest node and GPU, `spread`
the emptiest; `gpupool` takes the fullest GPU that fits (best fit) and, between nodes, prefers
one where the pod does not break into a whole free GPU, so whole GPUs stay whole for the pods
that need them (the fragmentation the trace policy measures).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MILLI_PER_GPU, format_bytes
from gpupool.k8s.inventory import GpuInfo
from gpupool.k8s.names import SLOTS_PER_GPU
from gpupool.k8s.podspec import GpuAsk

I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]
F64 = npt.NDArray[np.float64]

POLICIES = ("gpupool", "binpack", "spread")
DEFAULT_POLICY = "gpupool"
#: the kube-scheduler extender API's top score (k8s.io/kube-scheduler/extender/v1)
MAX_EXTENDER_PRIORITY = 10


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise InvalidRequest(f"unknown policy {name!r}; valid policies: {', '.join(POLICIES)}")
    return name


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
        self._alloc(0, 1)

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

    def _need_memory(self, ask: GpuAsk, rows: I64) -> I64:
        total = self.mem_total[rows]
        if ask.exclusive:
            return total
        if ask.memory is not None:
            return np.full_like(total, ask.memory)
        return total * ask.compute // MILLI_PER_GPU

    def _model_ok(self, ask: GpuAsk, rows: I64) -> Bool | bool:
        if ask.gpu_model is None:
            return True
        model = self.models.get(ask.gpu_model, -2)
        ok: Bool = self.model[rows] == model
        return ok

    def fitting_gpus(self, ask: GpuAsk, rows: I64) -> Bool:
        """(rows, slots): the GPUs where one GPU of the ask fits now."""
        free_mem = self.mem_total[rows] - self.mem_used[rows]
        free_milli = MILLI_PER_GPU - self.milli_used[rows]
        ok = self.usable[rows] & (free_mem >= self._need_memory(ask, rows))
        ok &= free_milli >= ask.compute
        ok &= self._model_ok(ask, rows)
        if ask.exclusive:
            ok &= self.shares[rows] == 0
        else:
            ok &= self.shares[rows] < SLOTS_PER_GPU
        return ok

    def filter(self, ask: GpuAsk, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """The nodes where the pod fits, and why each other one does not."""
        known = [n for n in names if n in self.rows]
        failed = {
            n: "gpupool knows no GPU inventory for this node" for n in names if n not in self.rows
        }
        if not known:
            return [], failed
        rows = np.fromiter((self.rows[n] for n in known), np.int64, len(known))
        fits = self.fitting_gpus(ask, rows).sum(axis=1) >= ask.gpus
        for i in np.flatnonzero(~fits):
            failed[known[i]] = self.why_not(ask, int(rows[i]))
        return [known[i] for i in np.flatnonzero(fits)], failed

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

    def scores(self, ask: GpuAsk, names: Sequence[str], policy: str) -> list[int]:
        """0..MAX_EXTENDER_PRIORITY per node (0 where the pod does not fit)."""
        known = [self.rows.get(n, -1) for n in names]
        rows = np.array([r if r >= 0 else 0 for r in known], np.int64)
        ok = self.fitting_gpus(ask, rows)
        fits = (ok.sum(axis=1) >= ask.gpus) & (np.array(known) >= 0)
        if policy == "gpupool":
            raw = self._gpupool_scores(ask, rows, ok)
        else:
            raw = self._usage_after(ask, rows)
            if policy == "spread":
                raw = 1.0 - raw
        scaled = np.rint(np.clip(raw, 0.0, 1.0) * MAX_EXTENDER_PRIORITY).astype(np.int64)
        return [int(s) for s in np.where(fits, scaled, 0)]

    def _usage_after(self, ask: GpuAsk, rows: I64) -> F64:
        capacity = np.maximum(self.usable[rows].sum(axis=1) * MILLI_PER_GPU, 1)
        used = (self.milli_used[rows] * self.usable[rows]).sum(axis=1) + ask.gpus * ask.compute
        usage: F64 = used / capacity
        return usage

    def _gpupool_scores(self, ask: GpuAsk, rows: I64, ok: Bool) -> F64:
        # fill of the k-th fullest fitting GPU after placement: the best fit of the ask's GPUs
        before = np.where(ok, self.milli_used[rows], -1)
        kth = np.sort(before, axis=1)[:, ::-1][:, min(ask.gpus, before.shape[1]) - 1]
        fill = (kth + ask.compute) / MILLI_PER_GPU
        # a pod that starts a fresh GPU while a used one would do breaks a whole GPU
        keeps_whole = (kth > 0) | (ask.compute >= MILLI_PER_GPU)
        score: F64 = 0.5 * fill + 0.5 * keeps_whole
        return score

    def choose(self, ask: GpuAsk, node: str, policy: str) -> tuple[int, ...]:
        """The GPU indices the pod takes on `node`; Unschedulable-worthy text as InvalidRequest."""
        row = self.rows.get(node)
        if row is None:
            raise InvalidRequest(f"node {node}: gpupool knows no GPU inventory for it")
        ok = self.fitting_gpus(ask, np.array([row], np.int64))[0]
        candidates = np.flatnonzero(ok)
        if len(candidates) < ask.gpus:
            raise InvalidRequest(f"node {node}: {self.why_not(ask, row)}")
        used = self.milli_used[row, candidates]
        order = np.argsort(used if policy == "spread" else -used, kind="stable")
        return tuple(sorted(int(candidates[i]) for i in order[: ask.gpus]))

    def memory_of(self, ask: GpuAsk, node: str, gpus: Sequence[int]) -> int:
        """Bytes the pod holds on each of its GPUs (the smallest GPU's share when proportional)."""
        row = self.rows[node]
        need = self._need_memory(ask, np.array([row], np.int64))[0]
        return int(min(int(need[g]) for g in gpus))

    def overcommitted(self) -> list[tuple[str, int]]:
        """(node, GPU) pairs holding more than the GPU has: must stay empty."""
        over = (self.milli_used > MILLI_PER_GPU) | (self.mem_used > self.mem_total)
        return [(self.names[r], int(g)) for r, g in zip(*np.nonzero(over), strict=True)]
