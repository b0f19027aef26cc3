"""FGD's node fragment F_n for a target workload, cached per node and scored as array operations.

For spec m (cpu c_m, per-GPU milli u_m, k_m GPUs, allowed models, GPU memory v_m) and node n
(free CPU c, free milli g_1..g_k, G = sum g_i), a GPU "holds" m when its model is allowed and
g_i >= u_m and its free memory >= v_m. fragment_n(m) is G when m needs no GPU or does not fit
(c < c_m or fewer than k_m GPUs hold it); otherwise it is the sum of the g_i of the GPUs that
do not hold m. F_n = sum_m p_m fragment_n(m). A GPU that is not usable (unhealthy) is no one's
fragment. The trace's pods ask no GPU memory and its nodes are one model each: there a GPU holds
m exactly when g_i >= u_m and its node's model is allowed (the paper's definition).

Two per-(node, spec) counters make this incremental: cnt[n, m] = #{i: GPU i holds m} and
less[n, m] = sum{g_i: GPU i does not hold m}. Changing one GPU shifts each by a term that
depends only on that GPU, so the fragment after a hypothetical placement on many candidate
(node, GPU) pairs is a few (K, M) array operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.spec_tables import kept_per_shape, spec_tables
from gpupool.scheduler.state import ClusterState
from gpupool.scheduler.types import BoolArray, FloatArray, IntArray
from gpupool.scheduler.workload import TargetWorkload


@dataclass
class AfterCache:
    """Per node, for one request shape: F after placing it, the GPU it would use, the decrease
    of F and FGD's integer score of it (kept with the answer: both change only when the node
    does), and the node version this was computed at (-1: never)."""

    after: FloatArray
    gpus: IntArray
    seen: IntArray
    delta: FloatArray
    fgd: IntArray

    @classmethod
    def empty(cls, n: int) -> AfterCache:
        never = np.full(n, -1, np.int64)
        return cls(np.zeros(n), never.copy(), never, np.zeros(n), np.zeros(n, np.int64))


class FragmentIndex:
    """F_n for every node of a ClusterState and one target workload, kept current."""

    def __init__(self, state: ClusterState, target: TargetWorkload) -> None:
        self.state = state
        self.target = target
        self.specs = spec_tables(target)
        model_ok = self.specs.model_ok(state.model_names)
        # A GPU's kind: its model, memory and whether it is usable, fixed for the state's life.
        # Whether a GPU holds a spec depends, beyond its free milli and memory, on its kind
        # alone: per kind, the memory each spec needs and whether the GPU can hold it at all.
        # (one integer key per GPU: a 1-D unique costs far less than a unique over rows, and
        # the node daemon makes an index per decision)
        models, total = state.gpu_model.ravel(), state.gpu_mem_total.ravel()
        usable = state.usable.ravel()
        key = (total * (len(state.model_names) + 1) + (models + 1)) * 2 + usable
        _, first, kind = np.unique(key, return_index=True, return_inverse=True)
        self.gpu_kind: IntArray = kind.reshape(state.gpu_model.shape).astype(np.int64)
        self.needs = self.specs.needs(total[first])
        self.kind_ok: BoolArray = usable[first][:, None] & model_ok[models[first]]
        #: model_ok per node (its first GPU's model): looked up once, not on every score
        self.node_ok: BoolArray = model_ok[state.model_id]
        #: the trace's case: holding is compute alone, models per node (the fast formulas)
        self.simple = state.simple and not self.specs.asks_memory
        n, m = state.n_nodes, len(target.specs)
        self.cnt: IntArray = np.zeros((n, m), np.int64)
        #: whole milli, held as float64: the fragment's product takes float64, and a cast per
        #: call costs more than the rest of a one-node update
        self.less: FloatArray = np.zeros((n, m), np.float64)
        self.frag: FloatArray = np.zeros(n, np.float64)
        #: general case: held[n, i, m], GPU i of node n holds spec m now (what a placement
        #: there changes from)
        self.held: BoolArray = np.zeros(
            (n, state.max_gpus, m) if not self.simple else (0, 0, 0), np.bool_
        )
        #: general case: cnt >= g_m and cnt == g_m per node and spec, as cnt is
        self.enough: BoolArray = np.zeros((n, m) if not self.simple else (0, 0), np.bool_)
        self.just_enough: BoolArray = np.zeros_like(self.enough)
        #: bumped whenever a node's free resources change; invalidates cached answers for it
        self.version: IntArray = np.zeros(n, np.int64)
        self._after: dict[tuple[object, ...], AfterCache] = {}
        self._refresh_rows(np.arange(n))

    @property
    def total(self) -> float:
        """Sum of F_n over the cluster (milli)."""
        return float(self.frag.sum())

    def refresh_node(self, node: int) -> None:
        """Recompute node `node` after its free resources changed."""
        self.version[node] += 1
        if not self.simple:
            self._refresh_rows(np.array([node]))
            return
        # one row: table lookups and scalars (per-call overhead dominates arrays this small)
        free = self.state.gpu_free[node] + 1
        cnt = self.specs.hold_table[free].sum(axis=0)
        less = self.specs.less_table[free].sum(axis=0)
        self.cnt[node] = cnt
        self.less[node] = less
        self.frag[node] = self.fragment_of(node, cnt, less, self.state.gpu_free_total[node], 0)

    def fragment_of(
        self, node: int, cnt: IntArray, less: FloatArray, gpu_total: int, cpu_request: int
    ) -> float:
        """`fragment` of the one row `node` (simple case): the same arithmetic, the same
        (1, M) product, so the same bits."""
        fits = (
            self.node_ok[node]
            & (self.specs.cpu <= self.state.cpu_free[node] - cpu_request)
            & (cnt >= self.specs.gpus)
        )
        per_spec = np.where(fits, less, gpu_total)
        return float((per_spec[None, :] @ self.specs.prob)[0])

    def after_cache(self, shape: tuple[object, ...]) -> AfterCache:
        """The cache of per-node answers for a request shape."""
        return kept_per_shape(self._after, shape, lambda: AfterCache.empty(self.state.n_nodes))

    def holds(self, nodes: IntArray, gpus: IntArray, free: IntArray, memory: IntArray) -> BoolArray:
        """(K, M): GPU gpus[k] of node nodes[k], with `free` milli and `memory` bytes free,
        holds spec m (general form)."""
        kind = self.gpu_kind[nodes, gpus]
        held: BoolArray = np.take(self.kind_ok, kind, axis=0)
        held &= self._milli_fits(free)
        held &= self._memory_fits(kind, memory)
        return held

    def counters(
        self, nodes: IntArray, free: IntArray, memory: IntArray
    ) -> tuple[IntArray, IntArray]:
        """cnt and less of rows `nodes` whose GPUs have `free` milli and `memory` bytes free
        ((K, slots) arrays, the rows as they are or as a placement would leave them)."""
        if self.simple:
            f = free[:, :, None]
            u = self.specs.milli[None, None, :]
            present = f >= 0
            return (
                np.count_nonzero(present & (f >= u), axis=1).astype(np.int64),
                np.where(present & (f < u), f, 0).sum(axis=1),
            )
        return self._counted(nodes, free, self.held_by(nodes, free, memory))

    def _counted(
        self, nodes: IntArray, free: IntArray, held: BoolArray
    ) -> tuple[IntArray, IntArray]:
        usable = self.state.usable[nodes][:, :, None]
        less = np.where(usable & ~held, free[:, :, None], 0).sum(axis=1)
        return held.sum(axis=1).astype(np.int64), less

    def held_by(self, nodes: IntArray, free: IntArray, memory: IntArray) -> BoolArray:
        """(K, slots, M): `holds` for every slot of rows `nodes` with `free` and `memory`."""
        k, width = free.shape
        rows = np.repeat(nodes, width)
        slots = np.tile(np.arange(width), k)
        held: BoolArray = self.holds(rows, slots, free.ravel(), memory.ravel()).reshape(
            k, width, -1
        )
        return held

    def _refresh_rows(self, rows: IntArray) -> None:
        state = self.state
        free, memory = state.gpu_free[rows], state.gpu_mem_free[rows]
        if self.simple:
            self.cnt[rows], self.less[rows] = self.counters(rows, free, memory)
        else:
            held = self.held[rows] = self.held_by(rows, free, memory)
            self.cnt[rows], self.less[rows] = self._counted(rows, free, held)
            self.enough[rows] = self.cnt[rows] >= self.specs.gpus[None, :]
            self.just_enough[rows] = self.cnt[rows] == self.specs.gpus[None, :]
        self.frag[rows] = self.fragment(
            rows, self.cnt[rows], self.less[rows], state.gpu_free_total[rows], 0
        )

    def fragment(
        self,
        nodes: IntArray,
        cnt: IntArray,
        less: IntArray | FloatArray,
        gpu_total: IntArray,
        cpu_request: int,
    ) -> FloatArray:
        """F for rows `nodes` given their counters and free GPU total, after `cpu_request`
        milli-CPU is taken from each (`less` is the caller's own copy: it is written over)."""
        return self._fragment(nodes, cnt >= self.specs.gpus[None, :], less, gpu_total, cpu_request)

    def _fragment(
        self,
        nodes: IntArray,
        fits: BoolArray,
        less: IntArray | FloatArray,
        gpu_total: IntArray,
        cpu_request: int,
    ) -> FloatArray:
        """`fragment` given where enough GPUs hold each spec (`fits` and `less` are changed in
        place)."""
        cpu_left = self.state.cpu_free[nodes] - cpu_request
        if self.simple:
            fits &= self.node_ok[nodes]
        elif not self.specs.all_want_gpus:  # models are judged per GPU, in cnt
            fits &= self.specs.gpus[None, :] > 0
        # (K, M) passes skipped where they cannot change the answer: the live specs ask no CPU
        if self.simple or (cpu_left.size and self.specs.max_cpu > cpu_left.min()):
            fits &= cpu_left[:, None] >= self.specs.cpu[None, :]
        # per spec: `less` where it fits, else the whole free total (written over `less`, which
        # every caller makes for this call: one pass instead of a third (K, M) array)
        per_spec = less.astype(np.float64, copy=False)
        np.copyto(per_spec, gpu_total[:, None].astype(np.float64), where=~fits)
        result: FloatArray = per_spec @ self.specs.prob
        return result

    def after_share(
        self, nodes: IntArray, gpus: IntArray, milli: int, memory: IntArray, cpu_request: int
    ) -> FloatArray:
        """F of each candidate (nodes[j], gpus[j]) after a share of `milli` and `memory[j]`
        bytes lands on that GPU."""
        state = self.state
        old = state.gpu_free[nodes, gpus]
        new = old - milli
        if self.simple:  # the GPU is present and fits: old and new are 0..1000
            hold, free_less = self.specs.hold_table, self.specs.less_table
            cnt = self.cnt[nodes] - hold[old + 1] + hold[new + 1]
            less = self.less[nodes] - free_less[old + 1] + free_less[new + 1]
        else:
            # with less free milli and memory, a GPU holds a subset of what it held (`was`):
            # `now` is `was` less what no longer fits; `lost` what the GPU stops holding
            # (np.take: these gathers of (K, M) rows are most of an answer's time)
            n, width, m = self.held.shape
            was = np.take(self.held.reshape(n * width, m), nodes * width + gpus, axis=0)
            now = was & self._milli_fits(new)
            now &= self._memory_fits(
                self.gpu_kind[nodes, gpus], state.gpu_mem_free[nodes, gpus] - memory
            )
            lost = was > now
            # enough GPUs hold spec m after (cnt - lost >= g_m): they did, and the GPU taken
            # was not one of exactly g_m that did (bool rows kept per node, not (K, M) ints)
            fits = np.take(self.enough, nodes, axis=0)
            fits &= ~(lost & np.take(self.just_enough, nodes, axis=0))
            # less gains the new free milli of a spec lost (old - milli + milli) and loses the
            # milli of a spec never held: in small integers first, then one float64 pass
            change = was * np.int16(milli)
            change += lost * new[:, None].astype(np.int16)
            change -= np.int16(milli)
            less = np.take(self.less, nodes, axis=0)
            less += change
            return self._fragment(
                nodes, fits, less, state.gpu_free_total[nodes] - milli, cpu_request
            )
        total = state.gpu_free_total[nodes] - milli
        return self.fragment(nodes, cnt, less, total, cpu_request)

    def _milli_fits(self, free: IntArray) -> BoolArray:
        """(K, M): `free[k]` milli free are enough for spec m (by compute alone); a GPU never
        has more than a whole GPU free, and less than none (an absent slot, -1) holds nothing.
        (np.maximum: np.clip's own overhead is more than a small call's whole work)"""
        rows = np.maximum(free + 1, 0)
        fits: BoolArray = np.take(self.specs.milli_held, rows, axis=0)
        return fits

    def _memory_fits(self, kind: IntArray, memory: IntArray) -> BoolArray:
        """(K, M): `memory[k]` bytes free are enough for spec m on a GPU of kind `kind[k]`:
        how many of the kind's needs (sorted) it covers, then that row of `memory_held`."""
        width = self.needs.need.shape[1] + 1
        if self.needs.need.shape[0] == 1:
            rows = np.searchsorted(self.needs.need_sorted[0], memory, side="right")
        else:
            rows = np.empty(kind.size, np.int64)
            for each in np.unique(kind):
                mine = kind == each
                covered = np.searchsorted(self.needs.need_sorted[each], memory[mine], side="right")
                rows[mine] = covered + each * width
        fits: BoolArray = np.take(self.needs.memory_held, rows, axis=0)
        return fits

    def after_whole(self, nodes: IntArray, gpus: int, cpu_request: int) -> FloatArray:
        """F of each node in `nodes` after `gpus` completely free GPUs (and the CPU) are taken
        (the simple case).

        A free GPU (1000 milli) counts in cnt for every spec (u_m <= 1000) and becomes 0, which
        adds nothing to `less`; so only cnt and the total move.
        """
        cnt = self.cnt[nodes] - gpus * self.specs.whole_held[None, :]
        total = self.state.gpu_free_total[nodes] - gpus * MILLI_PER_GPU
        return self.fragment(nodes, cnt, self.less[nodes], total, cpu_request)

    def after_taking(
        self, nodes: IntArray, chosen: BoolArray, milli: int, memory: IntArray, cpu_request: int
    ) -> FloatArray:
        """F of each node after `milli` and `memory` (per slot) are taken on its `chosen`
        slots ((K, slots) masks; the general case)."""
        state = self.state
        free = state.gpu_free[nodes] - chosen * milli
        mem = state.gpu_mem_free[nodes] - chosen * memory
        cnt, less = self.counters(nodes, free, mem)
        total = np.where(state.usable[nodes], np.maximum(free, 0), 0).sum(axis=1)
        return self.fragment(nodes, cnt, less, total, cpu_request)


def fragment_index(state: ClusterState, target: TargetWorkload) -> FragmentIndex:
    """The fragment index of `state` for `target`, built once, then kept current by the state's
    changes (only the changed node is recomputed)."""
    return state.observer(("fragment", target), lambda: FragmentIndex(state, target))
