"""The GPUs of every node the extender knows, as arrays: fit, why-not, score, GPU choice.

One column per node, one row per GPU slot (padded), kept up to date as nodes and pods come and
go (`set_node`, `charge`: one node's column recomputed), so that a pod's filter and prioritize
over 10,000 nodes are a few vector operations (gpu_arrays) answered within milliseconds; filter
and prioritize of one pod share one `PodAnswer`. The answers are scheduler/gpu_placement's,
node by node; `choose` (at bind) calls gpu_placement itself. Policies, as gpu_placement names
them: `binpack` fills the fullest node and GPU, `spread` the emptiest, `gpupool` (the default)
takes the GPUs where the pod grows the fragment least, so whole GPUs stay whole for the pods
that need them (the fragmentation the trace policy measures). A `low` pod is opportunistic
(scheduler/opportunistic.py): it is answered over the GPUs as it sees them, every GPU's compute
free, and what it holds (its `Charge`) is its memory and no compute.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MILLI_PER_GPU
from gpupool.k8s.gpu_arrays import (
    F64,
    I64,
    MAX_EXTENDER_PRIORITY,
    MAX_GPUS_PER_NODE,
    Bool,
    GpuArrays,
    PodAnswer,
    priorities,
)
from gpupool.k8s.inventory import GpuInfo
from gpupool.k8s.podspec import GpuAsk
from gpupool.scheduler.gpu_placement import Shortfall, never_fits, place
from gpupool.scheduler.gpus import GpuRequest, GpuView
from gpupool.scheduler.opportunistic import as_seen_by, opportunistic

POLICIES = ("gpupool", "binpack", "spread")
DEFAULT_POLICY = "gpupool"
#: why a node the extender has no inventory for fails the filter (until a re-read learns it)
UNKNOWN_NODE = "gpupool knows no GPUs on this node"

_LOOKUPS_KEPT = 4
_ANSWERS_KEPT = 8
#: the filter's passing list is the candidates less those that fail when fewer fail than this
_FEW_FAIL = 64
_NEVER_KEPT = 1 << 16
#: changes logged; an answer older than the log is made anew
_LOG_KEPT = 1 << 14
#: an answer with more than this part of the nodes changed since is made anew
_UPDATE_AT_MOST = 0.125
#: more nodes changed than this since a low pod was answered: the GPUs as low pods see them are
#: made again for every node at once (0.9 ms for 10,000), not node by node (23 us each)
_STALE_ONE_BY_ONE = 32
#: a candidate list at least this part of the fleet is answered over the whole fleet's arrays
#: (no copies; the filter's and the prioritize's lists then share one answer)
_WHOLE_FLEET = 0.5


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
    """A candidate list and its rows (-1: a node without inventory)."""

    names: list[str]
    rows: I64
    #: the list object last found equal to `names` (the extender never changes one it got)
    seen: list[str] | None = None

    @property
    def known(self) -> Bool:
        known: Bool = self.rows >= 0
        return known


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
        self.gpus = GpuArrays.empty(1, 1)  # (GPU slot, node)
        #: the same GPUs as a `low` pod sees them (every GPU's compute free), brought up to date
        #: only when a low pod is answered, on the nodes changed since (`_opportunistic_stale`):
        #: binds and re-reads of high pods do not pay for it
        self.opportunistic_gpus = GpuArrays.empty(1, 1)
        self._opportunistic_stale: set[int] = set()
        #: what pods hold, summed (may pass the GPU for a moment while a node is re-read)
        self._memory_used: I64 = np.zeros((1, 1), np.int64)
        self._milli_used: I64 = np.zeros((1, 1), np.int64)
        #: recent candidate lists and their rows (filter's list, then prioritize's shorter one)
        self._lookups: list[_Lookup] = []
        #: bumped on every change, so that cached answers know when they are stale
        self.version = 0
        #: the node changed by each version after `_log_start` (what pods hold on it)
        self._log: list[int] = []
        self._log_start = 0
        self._inventory: dict[str, tuple[GpuInfo, ...]] = {}
        #: the whole fleet's answers to the last few requests, at the version they are true for:
        #: a pod like one before (replicas of one workload) updates only the nodes changed since
        self._answers: dict[tuple[GpuRequest, bool], tuple[int, PodAnswer]] = {}
        #: (ask, version, candidates, answer) of the last pod asked about a few nodes
        self._answer: tuple[GpuAsk, int, _Lookup, PodAnswer] | None = None
        #: never_fits's line per (request, row), until a node's inventory changes
        self._never: dict[tuple[GpuRequest, int], str | None] = {}
        #: (MAX_EXTENDER_PRIORITY + 1, rows): each node's HostPriority entry for each score
        self._entries: npt.NDArray[np.object_] | None = None

    def lookup(self, names: list[str]) -> I64:
        """Row of each name, -1 for a node without inventory."""
        return self._lookup(names).rows

    def _lookup(self, names: list[str]) -> _Lookup:
        """The rows of a candidate list.

        kube-scheduler sends the same candidate lists cycle after cycle: recent answers are kept
        (comparing two lists of strings is far cheaper than 10,000 dict look-ups).
        """
        for known in self._lookups:
            # one request's list is looked up several times: the same object, not compared
            if known.seen is names or (len(known.names) == len(names) and known.names == names):
                known.seen = names
                return known
        try:
            rows = np.array([self.rows.get(n, -1) for n in names], np.int64)
        except TypeError as err:  # a name that is a list or an object
            raise InvalidRequest(f"invalid node names: {err}") from err
        found = _Lookup(list(names), rows)
        self._lookups = [found, *self._lookups[: _LOOKUPS_KEPT - 1]]
        return found

    # -- changes --------------------------------------------------------------------------------

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
        row = self.rows.get(name)
        if row is None:
            row = len(self.names)
            self.rows[name] = row
            self.names.append(name)
            self._lookups.clear()
            self._entries = None  # made again (all nodes) by the next prioritize
        self.version += 1
        # answers older than the log are made anew: what the GPUs are changed
        self._log, self._log_start = [], self.version
        self._never.clear()
        g, n = self.gpus.present.shape
        if row >= n or width > g:
            self._grow(width, max(row + 1, 2 * n))
        arrays = self.gpus
        arrays.present[:, row] = False
        arrays.healthy[:, row] = False
        arrays.memory_total[:, row] = 0
        arrays.model[:, row] = -1
        for gpu in gpus:
            model = self.models.setdefault(gpu.model, len(self.models))
            arrays.present[gpu.index, row] = True
            arrays.healthy[gpu.index, row] = gpu.healthy and gpu.memory > 0
            arrays.memory_total[gpu.index, row] = gpu.memory
            arrays.model[gpu.index, row] = model
        self._refresh(row)

    def _grow(self, g: int, n: int) -> None:
        self.gpus = self.gpus.grown(g, n)
        self.opportunistic_gpus = self.opportunistic_gpus.grown(g, n)
        og, on = self._memory_used.shape
        for attr in ("_memory_used", "_milli_used"):
            bigger = np.zeros(self.gpus.present.shape, np.int64)
            bigger[:og, :on] = getattr(self, attr)
            setattr(self, attr, bigger)

    def charge(self, charge: Charge, sign: int = 1) -> None:
        """Take (sign 1) or give back (sign -1) what a pod holds."""
        row = self.rows[charge.node]
        cols = list(charge.gpus)
        self._memory_used[cols, row] += sign * charge.memory
        self._milli_used[cols, row] += sign * charge.milli
        self.gpus.shares[cols, row] += sign
        self.version += 1
        self._log.append(row)
        if len(self._log) > _LOG_KEPT:
            del self._log[: _LOG_KEPT // 2]
            self._log_start = self.version - len(self._log)
        self._refresh(row)

    def _changed_since(self, version: int) -> I64 | None:
        """The nodes changed since `version`; None when too many to update an answer (or
        when the log does not reach back that far)."""
        if version < self._log_start:
            return None
        changed = np.unique(np.array(self._log[version - self._log_start :], np.int64))
        return None if len(changed) > _UPDATE_AT_MOST * len(self.names) else changed

    def _refresh(self, row: int) -> None:
        arrays = self.gpus
        total = arrays.memory_total[:, row]
        compute_free = np.clip(MILLI_PER_GPU - self._milli_used[:, row], 0, MILLI_PER_GPU)
        arrays.compute_free[:, row] = compute_free
        arrays.memory_free[:, row] = np.clip(total - self._memory_used[:, row], 0, total)
        arrays.refresh(row)
        self._opportunistic_stale.add(row)

    # -- one pod's answers ----------------------------------------------------------------------

    def _seen_by(self, ask: GpuAsk) -> GpuArrays:
        """The GPUs as the pod's placement sees them (scheduler/opportunistic.py), up to date."""
        if not opportunistic(ask.priority):
            return self.gpus
        stale, arrays = self._opportunistic_stale, self.opportunistic_gpus
        if len(stale) > _STALE_ONE_BY_ONE:
            arrays.refresh_opportunistic(self.gpus, slice(0, len(self.names)))
        else:
            for row in stale:
                arrays.refresh_opportunistic(self.gpus, row)
        stale.clear()
        return arrays

    def _pod(self, ask: GpuAsk, found: _Lookup) -> tuple[PodAnswer, I64 | None]:
        """The pod's answer over the candidates, and the rows to read it at (None: it is per
        candidate already)."""
        rows = np.where(found.known, found.rows, 0)
        arrays = self._seen_by(ask)
        if len(found.names) >= _WHOLE_FLEET * len(self.names):
            return self._whole_fleet(ask, arrays), rows
        cached = self._answer
        if cached and cached[0] == ask and cached[1] == self.version and cached[2] is found:
            return cached[3], None
        answer = PodAnswer(gpu_request(ask), arrays.nodes(rows), self.models)
        self._answer = (ask, self.version, found, answer)
        return answer, None

    def _whole_fleet(self, ask: GpuAsk, arrays: GpuArrays) -> PodAnswer:
        """The answer to the pod's request over every node's `arrays` (as it sees them): the
        one from before, brought up to date where nodes changed since, or a new one."""
        request = gpu_request(ask)
        key = (request, opportunistic(ask.priority))
        known = self._answers.pop(key, None)
        changed = None if known is None else self._changed_since(known[0])
        if known is None or changed is None:
            answer = PodAnswer(request, arrays.head(len(self.names)), self.models)
        else:
            answer = known[1]
            if len(changed):
                answer.update(changed)
        self._answers[key] = (self.version, answer)
        while len(self._answers) > _ANSWERS_KEPT:
            del self._answers[next(iter(self._answers))]
        return answer

    def filter(
        self, ask: GpuAsk, names: list[str]
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """The nodes where the pod fits now; why each other one does not now (gpu_placement's
        shortfall of GPUs); why each never could (gpu_placement.never_fits)."""
        found = self._lookup(names)
        answer, at = self._pod(ask, found)
        fits, able = answer.fits, answer.able
        if at is not None:
            fits, able = fits[at], able[at]
        fits = fits & found.known
        if fits.all():
            return list(names), {}, {}
        failing = np.flatnonzero(~fits)
        nodes = failing if at is None else at[failing]
        never = answer.never(nodes).tolist()
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for i, never_here in zip(failing.tolist(), never, strict=True):
            row = int(found.rows[i])
            if row < 0:
                unresolvable[names[i]] = UNKNOWN_NODE
            elif never_here:
                unresolvable[names[i]] = self.never_fits(ask, row)
            else:
                failed[names[i]] = str(Shortfall(-1, "gpus", ask.gpus, int(able[i])))
        kept = np.flatnonzero(fits)
        if len(failing) < _FEW_FAIL:  # cheaper than a list of 10,000 names picked one by one
            fit = list(names)
            for i in reversed(failing.tolist()):
                del fit[i]
        else:
            fit = [names[i] for i in kept.tolist()]
        # kube-scheduler sends prioritize these names: their rows are known already
        self._lookups = [_Lookup(list(fit), found.rows[kept]), *self._lookups[: _LOOKUPS_KEPT - 1]]
        return fit, failed, unresolvable

    def never_fits(self, ask: GpuAsk, row: int) -> str:
        """gpu_placement.never_fits's line for a node the vectors found the pod never fits."""
        key = (gpu_request(ask), row)
        if key not in self._never:
            if len(self._never) >= _NEVER_KEPT:  # many pod shapes: start again
                self._never.clear()
            self._never[key] = never_fits(key[0], self.gpu_views(self.names[row]))
        return self._never[key] or "the pod never fits this node"

    def node_scores(self, ask: GpuAsk, names: list[str], policy: str) -> tuple[Bool, F64]:
        """Per node: the pod fits now, and gpu_placement.node_score (0..100; meaningless where
        it does not fit)."""
        found = self._lookup(names)
        answer, at = self._pod(ask, found)
        fits, scores = answer.fits, answer.scores(policy)
        if at is not None:
            fits, scores = fits[at], scores[at]
        return fits & found.known, scores

    def scores(self, ask: GpuAsk, names: list[str], policy: str) -> I64:
        """0..MAX_EXTENDER_PRIORITY per node (0 where the pod does not fit)."""
        fits, scores = self.node_scores(ask, names, policy)
        result: I64 = np.where(fits, priorities(scores), 0)
        return result

    def priority_json(self, names: list[str], scores: I64) -> str:
        """The HostPriorityList as JSON, from each node's prepared entries (10,000 in well
        under a millisecond)."""
        found = self._lookup(names)
        if self._entries is None:
            heads = [_host_head(name) for name in self.names]
            self._entries = np.array(
                [[f"{head}{s}}}" for head in heads] for s in range(MAX_EXTENDER_PRIORITY + 1)],
                dtype=object,
            )
        known = found.known
        entries: list[str] = self._entries[scores[known], found.rows[known]].tolist()
        if not known.all():
            unknown = np.flatnonzero(~known).tolist()
            entries += [f"{_host_head(names[i])}{scores[i]}}}" for i in unknown]
        return "[" + ",".join(entries) + "]"

    # -- one node, for bind ---------------------------------------------------------------------

    def gpu_views(self, node: str) -> list[GpuView]:
        """`node`'s GPUs as the node daemon's placement sees them (what pods hold deducted; a
        GPU whose device slots are all held as not healthy)."""
        row = self.rows.get(node)
        if row is None:
            raise InvalidRequest(f"node {node}: gpupool knows no GPU inventory for it")
        model_names = {number: name for name, number in self.models.items()}
        a = self.gpus
        return [
            GpuView(
                int(g),
                model_names[int(a.model[g, row])],
                int(a.memory_total[g, row]),
                int(a.memory_free[g, row]),
                int(a.compute_free[g, row]),
                bool(a.usable[g, row]),
            )
            for g in np.flatnonzero(a.present[:, row])
        ]

    def choose(self, ask: GpuAsk, node: str, policy: str) -> tuple[int, ...]:
        """The GPU indices the pod takes on `node`: scheduler/gpu_placement's choice, the one the
        node daemon makes, so a pod lands on the GPUs a `gpupool submit` of it would get."""
        views = as_seen_by(ask.priority, self.gpu_views(node))
        placement = place(gpu_request(ask), views, policy)
        if placement.gpus is None:
            why = "; ".join(str(s) for s in placement.why_not)
            raise InvalidRequest(f"node {node}: {why}")
        return placement.gpus

    def memory_of(self, ask: GpuAsk, node: str, gpus: Sequence[int]) -> int:
        """Bytes the pod holds on each of its GPUs (the smallest GPU's share when proportional)."""
        request = gpu_request(ask)
        views = {view.index: view for view in self.gpu_views(node)}
        return min(request.memory_on(views[g]) for g in gpus)
