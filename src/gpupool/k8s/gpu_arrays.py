"""scheduler/gpu_placement's answers for many nodes at once: fit, never-fits, node scores.

`GpuArrays` holds one column per node and one row per GPU slot (padded: `present` says which
slots are GPUs); slot-major, so that the per-node reductions (how many GPUs fit, the least
growth) run along contiguous rows, ten times faster than along 8-wide ones. `PodAnswer`
answers one pod over such arrays with a few numpy operations per question, so that the
extender ranks 10,000 nodes within a millisecond. Every answer is a vectorised copy of a rule
of `gpupool.scheduler.gpu_placement` (named in its docstring);
tests/k8s/test_gpu_arrays_equality.py checks on random fleets that the answers are the same,
node by node. A `low` pod is answered over a second set of arrays, the GPUs as it sees them
(every GPU's compute free, scheduler/opportunistic.py), kept up to date with the first.
One rule is the extender's own: a GPU is advertised to the kubelet as
SLOTS_PER_GPU device slots, so a GPU whose slots are all held is not `usable` (gpu_placement
is shown it as not healthy: it takes no pod and its free compute is no fragment).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from gpupool.core.units import MILLI_PER_GPU, MemoryShare
from gpupool.k8s.names import SLOTS_PER_GPU
from gpupool.scheduler.gpu_placement import DEFAULT_TARGET
from gpupool.scheduler.gpus import GpuRequest

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Bool = npt.NDArray[np.bool_]
F64 = npt.NDArray[np.float64]

#: the kube-scheduler extender API's top score (k8s.io/kube-scheduler/extender/v1)
MAX_EXTENDER_PRIORITY = 10
#: added to the growth of a GPU where the pod does not fit: above any real one
_NO_FIT = 1 << 40
#: sort keys of binpack and spread: free compute (10 bits), free memory (below 16 TiB), slot
_MEMORY_BITS = 44
_SLOT_BITS = 5
_MAX_SLOTS = 1 << _SLOT_BITS
#: the GPU indices a node's inventory may use (the slot must fit the sort keys' bits)
MAX_GPUS_PER_NODE = _MAX_SLOTS


def _target() -> tuple[tuple[int, ...], float]:
    """DEFAULT_TARGET's compute per shape (ascending) and its one weight.

    The vectorised fragment relies on what that target is: one-GPU shapes of any model, memory
    in proportion to compute, equal weights. Shapes nested in compute are then nested in memory
    too, so a GPU holds exactly the h smallest shapes, h = min(held by compute, by memory).
    """
    shapes = [shape for shape, _ in DEFAULT_TARGET]
    weights = {weight for _, weight in DEFAULT_TARGET}
    if len(weights) != 1 or any(s.gpus != 1 or s.memory or s.gpu_models for s in shapes):
        raise RuntimeError("gpu_arrays assumes one-GPU, proportional, equally weighted shapes")
    return tuple(sorted(s.compute for s in shapes)), weights.pop()


TARGET_MILLI, TARGET_WEIGHT = _target()


@dataclass
class GpuArrays:
    """Per GPU slot (row) and node (column): what the GPU is and what is free on it.

    `fragment` (the compute the target shapes cannot use on the GPU, summed over the shapes)
    and `fullness` (binpack's measure) are kept with the rest (`refresh`), so a pod's questions
    compute only what changes with the pod.
    """

    present: Bool
    #: healthy, with memory (from the node's inventory)
    healthy: Bool
    #: healthy, and a device slot free
    usable: Bool
    model: I64
    shares: I32
    memory_total: I64
    compute_free: I32
    memory_free: I64
    fragment: I32
    fullness: F64
    #: (shape, slot, node): the memory each target shape needs on the GPU
    shape_memory: I64

    @classmethod
    def empty(cls, slots: int, nodes: int) -> GpuArrays:
        assert slots <= MAX_GPUS_PER_NODE, "Fleet.set_node refuses wider nodes"
        shape = (slots, nodes)
        return cls(
            np.zeros(shape, np.bool_),
            np.zeros(shape, np.bool_),
            np.zeros(shape, np.bool_),
            np.full(shape, -1, np.int64),
            np.zeros(shape, np.int32),
            np.zeros(shape, np.int64),
            np.zeros(shape, np.int32),
            np.zeros(shape, np.int64),
            np.zeros(shape, np.int32),
            np.zeros(shape, np.float64),
            np.zeros((len(TARGET_MILLI), *shape), np.int64),
        )

    def _map(self, how: Any) -> GpuArrays:
        return GpuArrays(**{f.name: how(getattr(self, f.name)) for f in fields(self)})

    def nodes(self, columns: I64) -> GpuArrays:
        """These nodes only (a copy)."""
        return self._map(lambda a: a[..., columns])

    def head(self, count: int) -> GpuArrays:
        """The first `count` nodes (views, no copy)."""
        return self._map(lambda a: a[..., :count])

    def grown(self, slots: int, nodes: int) -> GpuArrays:
        """Room for `slots` x `nodes`, what is held kept."""
        g, n = self.present.shape
        bigger = GpuArrays.empty(max(slots, g), max(nodes, n))
        for f in fields(self):
            getattr(bigger, f.name)[..., :g, :n] = getattr(self, f.name)
        return bigger

    def refresh_opportunistic(self, source: GpuArrays, nodes: int | slice) -> None:
        """Make these nodes (a column or a slice of them) here `source`'s, refreshed, as an
        opportunistic (`low`) pod sees them: every GPU's compute free
        (scheduler/opportunistic.as_seen_by), the rest as it is there."""
        for name in _COPIED:
            getattr(self, name)[..., nodes] = getattr(source, name)[..., nodes]
        self.compute_free[:, nodes] = MILLI_PER_GPU
        self._refresh_use(nodes)

    def refresh(self, node: int) -> None:
        """Recompute a node's derived arrays (usable, fragment, fullness, shape memory) from
        the rest."""
        total = self.memory_total[:, node]
        self.usable[:, node] = self.healthy[:, node] & (self.shares[:, node] < SLOTS_PER_GPU)
        for i, milli in enumerate(TARGET_MILLI):
            self.shape_memory[i, :, node] = total * milli // MILLI_PER_GPU
        self._refresh_use(node)

    def _refresh_use(self, node: int | slice) -> None:
        """Recompute a node's (or a slice of nodes') fragment and fullness from the free
        compute and memory."""
        compute, memory = self.compute_free[:, node], self.memory_free[:, node]
        self.fragment[:, node] = _lost(compute, memory, self.shape_memory[:, :, node])
        total, present = self.memory_total[:, node], self.present[:, node]
        self.fullness[:, node] = _fullness(compute, memory, total) * present


#: what an opportunistic pod sees as it is (its free compute is all, fragment and fullness follow)
_COPIED = tuple(
    f.name for f in fields(GpuArrays) if f.name not in {"compute_free", "fragment", "fullness"}
)


def _lost(compute_free: I32, memory_free: I64, shape_memory: I64) -> I32:
    """gpu_placement.fragment per GPU, without the weight: the GPU's free compute times the
    number of target shapes it cannot hold. (gpu_placement counts healthy GPUs only; a score
    depends only on the GPUs the pod takes, which are healthy, so the others are not told
    apart here.)"""
    by_compute = np.zeros(compute_free.shape, np.int32)
    by_memory = np.zeros(compute_free.shape, np.int32)
    for milli, memory in zip(TARGET_MILLI, shape_memory, strict=True):
        by_compute += compute_free >= milli
        by_memory += memory_free >= memory
    held = np.minimum(by_compute, by_memory)
    lost: I32 = compute_free * (len(TARGET_MILLI) - held)
    return lost


def _fullness(compute_free: Any, memory_free: Any, memory_total: Any) -> F64:
    """gpu_placement._fullness: the mean of the used fractions of compute and memory."""
    compute = 1 - compute_free / MILLI_PER_GPU
    with np.errstate(divide="ignore", invalid="ignore"):
        memory = np.where(memory_total > 0, 1 - memory_free / memory_total, 1.0)
    full: F64 = (compute + memory) / 2
    return full


def memory_need(request: GpuRequest, memory_total: I64) -> I64 | int:
    """GpuRequest.memory_on, per GPU (one number when it is the same on every GPU)."""
    memory = request.memory
    if memory is None:
        proportional: I64 = memory_total * request.compute // MILLI_PER_GPU
        return proportional
    if isinstance(memory, MemoryShare) and memory.bytes is None:
        assert memory.fraction is not None
        share: I64 = (memory_total * memory.fraction).astype(np.int64)
        return share
    return memory if isinstance(memory, int) else int(memory.resolve(0))


def priorities(scores: F64) -> I64:
    """gpu_placement's 0..100 node scores as the extender API's 0..MAX_EXTENDER_PRIORITY."""
    scaled: I64 = np.rint(scores * MAX_EXTENDER_PRIORITY / 100).astype(np.int64)
    return scaled


class PodAnswer:
    """One pod's (one GpuRequest's) answers over a set of nodes' GpuArrays."""

    def __init__(self, request: GpuRequest, gpus: GpuArrays, model_ids: dict[str, int]) -> None:
        self.request = request
        self.gpus = gpus
        self.model_ids = model_ids
        self.need = memory_need(request, gpus.memory_total)
        self.allowed: Bool = gpus.present
        if request.gpu_models:
            wanted = [model_ids.get(m, -2) for m in request.gpu_models]
            self.allowed = gpus.present & np.isin(gpus.model, wanted)
        #: gpu_placement.fitting: the GPUs that can take one GPU of the pod now
        self.ok: Bool = (
            gpus.usable
            & self.allowed
            & (gpus.compute_free >= request.compute)
            & (gpus.memory_free >= self.need)
        )
        #: per node, how many GPUs can take one GPU of the pod now
        self.able = self.ok.sum(axis=0, dtype=np.int8)
        self.fits: Bool = self.able >= request.gpus
        self._scores: dict[str, F64] = {}

    def update(self, nodes: I64) -> None:
        """Answer again for these nodes (column indices), whose GPUs' use changed (not what
        the GPUs are: a node's inventory changing calls for a new answer)."""
        again = PodAnswer(self.request, self.gpus.nodes(nodes), self.model_ids)
        self.ok[:, nodes] = again.ok
        self.able[nodes] = again.able
        self.fits[nodes] = again.fits
        for policy, scores in self._scores.items():
            scores[nodes] = again.scores(policy)

    def never(self, nodes: I64) -> Bool:
        """For these nodes (column indices): gpu_placement.never_fits is not None (too few
        GPUs, of the model, with the memory)."""
        k = self.request.gpus
        allowed = self.allowed[:, nodes]
        need = np.broadcast_to(self.need, self.allowed.shape)[:, nodes]
        roomy = allowed & (need <= self.gpus.memory_total[:, nodes])
        never: Bool = (
            (self.gpus.present[:, nodes].sum(axis=0) < k)
            | (allowed.sum(axis=0) < k)
            | (roomy.sum(axis=0) < k)
        )
        return never

    def scores(self, policy: str) -> F64:
        """gpu_placement.node_score per node (0..100, rounded as it rounds; meaningless where
        the pod does not fit)."""
        if policy not in self._scores:
            raw = self._gpupool() if policy == "gpupool" else self._fullness_after(policy)
            self._scores[policy] = np.round(raw, 6)
        return self._scores[policy]

    def _least(self, keys: I64) -> I64:
        """Per node, the sum of the k least growths (k the pod's GPU count), from keys that
        are growth x _MAX_SLOTS + slot, unique per node, so each GPU is counted once."""
        least = keys.min(axis=0)
        total: I64 = least >> _SLOT_BITS
        for _ in range(min(self.request.gpus, len(keys)) - 1):
            keys = keys + (keys == least) * _NO_FIT
            least = keys.min(axis=0)
            total += least >> _SLOT_BITS
        return total

    def _gpupool(self) -> F64:
        """The fragment the pod removes, on the k GPUs where it grows least (a GPU's fragment
        depends on that GPU alone, so taking them one at a time takes the k least)."""
        gpus, request = self.gpus, self.request
        compute_after = gpus.compute_free - np.int32(request.compute)
        after = _lost(compute_after, gpus.memory_free - self.need, gpus.shape_memory)
        growth = (after - gpus.fragment).astype(np.int64) + ~self.ok * _NO_FIT
        if request.gpus == 1:
            least = growth.min(axis=0)
        else:
            slots = np.arange(len(growth), dtype=np.int64)[:, None]
            least = self._least(growth * _MAX_SLOTS + slots)
        removed = -least * TARGET_WEIGHT
        score: F64 = np.clip(50 + 50 * removed / (request.compute * request.gpus), 0, 100)
        return score

    def _chosen(self, policy: str) -> Bool:
        """(slot, node): the GPUs binpack (fullest first, then lowest index) or spread
        (emptiest first) takes: the k least of unique keys."""
        gpus = self.gpus
        compute = gpus.compute_free.astype(np.int64)
        if policy == "binpack":
            key = (compute << _MEMORY_BITS) | gpus.memory_free
        else:
            key = ((MILLI_PER_GPU - compute) << _MEMORY_BITS) | (
                (1 << _MEMORY_BITS) - 1 - gpus.memory_free
            )
        slots = np.arange(len(key), dtype=np.int64)[:, None]
        # a GPU where the pod does not fit sorts after every other, one taken after those
        key = (key << _SLOT_BITS) | slots | (~self.ok * (1 << 61))
        chosen = np.zeros(key.shape, np.bool_)
        for _ in range(min(self.request.gpus, len(key))):
            least = key == key.min(axis=0)
            chosen |= least
            key |= least * (1 << 62)
        return chosen

    def _fullness_after(self, policy: str) -> F64:
        """The node's fullness after the pod (binpack), or its emptiness (spread)."""
        gpus, request = self.gpus, self.request
        chosen = self._chosen(policy)
        after = _fullness(
            gpus.compute_free - request.compute, gpus.memory_free - self.need, gpus.memory_total
        )
        change = ((after - gpus.fullness) * chosen).sum(axis=0)
        count = np.maximum(gpus.present.sum(axis=0), 1)
        full = (gpus.fullness.sum(axis=0) + change) / count
        score: F64 = 100 * full if policy == "binpack" else 100 * (1 - full)
        return score
