"""What the fragment index needs of a target workload alone, made once per target.

The node daemon makes a fragment index for every decision (its node as a one-row state), while
its target workload changes rarely: the specs' arrays, the holding tables and the answers per
GPU model list and per GPU memory size are kept with the target (a TargetWorkload is hashed by
identity) rather than made again for each decision.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.types import BoolArray, FloatArray, IntArray
from gpupool.scheduler.workload import TargetWorkload

#: request shapes whose per-node answers are kept (oldest dropped first); the trace has ~150
MAX_CACHED_SHAPES = 512

Kept = TypeVar("Kept")

#: free milli from -1 (no GPU in the slot) to a whole GPU, one row each: the tables' index
_FREE_ROWS: IntArray = np.arange(-1, MILLI_PER_GPU + 1)[:, None]


def kept_per_shape(
    cache: dict[tuple[object, ...], Kept], shape: tuple[object, ...], make: Callable[[], Kept]
) -> Kept:
    """cache[shape], made on first use; beyond MAX_CACHED_SHAPES the oldest shape goes first."""
    found = cache.get(shape)
    if found is None:
        if len(cache) >= MAX_CACHED_SHAPES:
            del cache[next(iter(cache))]
        found = cache[shape] = make()
    return found


@dataclass(frozen=True)
class KindNeeds:
    """For GPUs of a few memory sizes (kinds): the memory each spec needs on a GPU of each size
    (need[kind, m]), the needs of a kind in increasing order, and `memory_held`, whose row
    kind * (M + 1) + c says which specs hold when c of that kind's needs are covered (so the
    specs b bytes hold are one searchsorted and one row, not a (K, M) comparison)."""

    need: IntArray
    need_sorted: IntArray
    memory_held: BoolArray


class SpecTables:
    """The target's specs as arrays (one entry per spec m), and tables made from them."""

    def __init__(self, target: TargetWorkload) -> None:
        specs = target.specs
        self.cpu: IntArray = np.array([s.cpu for s in specs], np.int64)
        self.milli: IntArray = np.array([s.gpu_milli for s in specs], np.int64)
        self.gpus: IntArray = np.array([s.gpus for s in specs], np.int64)
        self.memory: IntArray = np.array([s.memory for s in specs], np.int64)
        self.share: FloatArray = np.array([s.memory_share for s in specs], np.float64)
        self.proportional: BoolArray = np.array([s.proportional for s in specs], np.bool_)
        self.prob: FloatArray = np.array(target.probabilities, np.float64)
        self.max_cpu = int(self.cpu.max(initial=0))
        self.all_want_gpus = bool((self.gpus > 0).all())
        self.asks_memory = any(s.asks_memory for s in specs)
        #: per spec, 1 where a completely free GPU holds it (what taking one whole GPU removes)
        self.whole_held: IntArray = (self.milli <= MILLI_PER_GPU).astype(np.int64)
        self._specs = specs
        self._model_ok: dict[tuple[object, ...], BoolArray] = {}
        self._needs: dict[tuple[object, ...], KindNeeds] = {}

    @functools.cached_property
    def milli_held(self) -> BoolArray:
        """Row f + 1: the specs a GPU with f milli free holds by compute (row 0: f < 0)."""
        held: BoolArray = self.milli[None, :] <= _FREE_ROWS
        return held

    @functools.cached_property
    def hold_table(self) -> IntArray:
        """The trace's case: what one GPU with f milli free adds to cnt, per spec, at row f + 1
        (row 0: no GPU), so that a node's counters are lookups and sums."""
        table: IntArray = (self.milli_held & (_FREE_ROWS >= 0)).astype(np.int64)
        return table

    @functools.cached_property
    def less_table(self) -> FloatArray:
        """As hold_table, what that GPU adds to less."""
        table: FloatArray = np.where((_FREE_ROWS >= 0) & ~self.milli_held, _FREE_ROWS, 0.0)
        return table

    def model_ok(self, model_names: tuple[str, ...]) -> BoolArray:
        """[model id, m]: spec m needs a GPU and accepts that model; the last row (id -1) is no
        GPU at all."""

        def make() -> BoolArray:
            table = np.zeros((len(model_names) + 1, len(self._specs)), np.bool_)
            for j, spec in enumerate(self._specs):
                for i, model in enumerate(model_names):
                    table[i, j] = spec.gpus > 0 and (
                        not spec.gpu_models or model in spec.gpu_models
                    )
            return table

        return kept_per_shape(self._model_ok, model_names, make)

    def needs(self, kind_totals: IntArray) -> KindNeeds:
        """KindNeeds for GPUs of these memory sizes (bytes, one per kind)."""
        return kept_per_shape(
            self._needs, tuple(kind_totals.tolist()), lambda: self._kind_needs(kind_totals)
        )

    def _kind_needs(self, kind_totals: IntArray) -> KindNeeds:
        total = kind_totals[:, None]
        need: IntArray = np.where(
            self.proportional[None, :],
            total * self.milli[None, :] // MILLI_PER_GPU,
            self.memory[None, :] + (total * self.share[None, :]).astype(np.int64),
        )
        kinds, m = need.shape
        order = np.argsort(need, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(m)[None, :], axis=1)
        held: BoolArray = np.arange(m + 1)[None, :, None] > rank[:, None, :]
        return KindNeeds(
            need, np.take_along_axis(need, order, axis=1), held.reshape(kinds * (m + 1), m)
        )


_TABLES: weakref.WeakKeyDictionary[TargetWorkload, SpecTables] = weakref.WeakKeyDictionary()


def spec_tables(target: TargetWorkload) -> SpecTables:
    """The target's SpecTables, made on first use (two threads may both make it: harmless)."""
    found = _TABLES.get(target)
    if found is None:
        found = _TABLES[target] = SpecTables(target)
    return found
