"""`gpupool`, the default policy: FGD's fragment gradient, the GPUs that CPU or memory strand, and
the packing value a share throws away.

FGD asks whether one pod of each popular spec still fits a node, so a node with eight free GPUs
and CPU for one more pod looks unfragmented; in the Alibaba trace that is how whole GPUs end up
idle beside exhausted CPU and memory. `gpupool` adds a fluid estimate of that loss: at the
workload's average CPU and host memory per GPU milli (rho_cpu, rho_mem), a node with G free GPU
milli, c free CPU and r free memory can feed at most min(c / rho_cpu, r / rho_mem) GPU milli, so

    stranded(n) = max(0, G - c / rho_cpu, G - r / rho_mem).

The score is delta_F - STRANDING_WEIGHT * (stranded after - stranded before), used raw (no integer
sigmoid); ties go to node order. When the target workload has multi-GPU specs, an idle node big
enough for the largest of them gets the term as a penalty only, never a reward: such nodes are
often CPU-short for a full load (an idle 96-core, 8-GPU node "strands" GPU milli at the trace's
14 CPU milli per GPU milli), and rewarding small pods there breaks up what multi-GPU pods need.

The term opens idle big nodes sooner than FGD does, and the workload's widest pods (8 GPUs and
up to 120 cores in the trace) then find none left: before the cluster fills, `gpupool` turned
them away where FGD did not. So once no more than RESERVED_NODES idle nodes could still take the
widest pod (its GPUs, and the most CPU and host memory such pods ask), those nodes are kept for
pods that wide: a narrower pod goes there only when nothing else fits. The widest pods come in
CPU sizes (8 GPUs with 64, 88 or 120 cores), and the smaller ones fail too once the term has
opened every idle 8-GPU node: so for each size, the idle nodes able to take one are kept the
same way from other pods once they are no more than KEPT_PER_EXPECTED_POD times the pods of that
size (or more CPU) expected among those that would fill the free GPUs. That reserve follows the
target's own mix of wide pods, and shrinks to nothing as the cluster fills.

A one-GPU share also pays for the packing value it throws away (scheduler/packing.py): the
target's share sizes priced by the packing LP, a share placed on a GPU with g milli free wastes
V(g) - V(g - s) - y_s of a GPU. FGD's fragment only sees how much free compute a placement
leaves, so it puts a 230 beside a 650 (120 left) rather than beside a 550 (220 left, a 220's
place), and the 320s that the 650s' 350s were for go to GPUs they fill worse. The waste, at
PACKING_WEIGHT milli per milli of a GPU, is added to F after on each of the node's GPUs: it
picks the share's GPU on the node and, outweighing any fragment change, the node. On the
Alibaba trace's `default` workload it takes `gpupool` from 4.16 % of the GPUs unallocated at
100 % arrived to 3.75 % (FGD: 4.77 %).

The stranding term assumes a pod may use any node. When the target workload has specs bound to
GPU models, it pulls unconstrained pods that are heavy on CPU onto the CPU-rich nodes, which in
the trace are the scarce models the bound pods need (measured: worse than FGD at 100 % arrived
on gpuspec10-33). With such specs `gpupool` therefore scores exactly as FGD does, and charges
no packing value either (measured: up to 0.03 points worse than FGD at some arrived % there).
docs/benchmarks/gpupool-policy-notes.md has the measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler.demand import Demand
from gpupool.scheduler.fgd import FragmentOptions, TargetedPolicy, fgd_scores, fragment_options
from gpupool.scheduler.fragment import fragment_index
from gpupool.scheduler.packing import share_prices
from gpupool.scheduler.policy import Scores
from gpupool.scheduler.spec_tables import kept_per_shape
from gpupool.scheduler.state import BoolArray, ClusterState, FloatArray, IntArray
from gpupool.scheduler.workload import TargetWorkload, WideSize

#: idle nodes able to take the workload's widest pod that are kept for such pods: once no more
#: than this many are left, narrower pods go there only when nothing else fits (measured on the
#: trace's 1213 nodes: 40 keeps `fgd`'s early curve, 10 and 20 do not)
RESERVED_NODES = 40
#: idle nodes kept for each CPU size of the widest pods, per pod of that size (or more CPU)
#: expected among those that would fill the free GPUs (share x free GPU milli / GPU milli per
#: pod); measured on cpu300: 1.5 leaves it behind `fgd` at 81 % arrived (seeds 42-51), 2 never;
#: 4 gives up 1.8 of the 2.2 points it wins at 100 % (seeds 42-44)
KEPT_PER_EXPECTED_POD = 2.0
#: what using a reserved node costs a narrower pod's score (more than any fragment change)
RESERVE_PENALTY = 1e7
#: weight of the stranded-GPU term against FGD's fragment decrease (both in GPU milli);
#: 0.25..2 all measured within 0.05 points on `default`, 0.5 best
STRANDING_WEIGHT = 0.5
#: GPU milli that a share's placement costs per milli of a GPU's packing value it throws away
#: (packing.SharePrices.lost): measured on `default`, seeds 42-44, 0.3 and 1 leave part of the
#: gain, 10 and 30 decide alike (a loss then outweighs any fragment change)
PACKING_WEIGHT = 10.0
#: decimals a score is rounded to, so that float noise does not split nodes that tie
DECIMALS = 6
ROUNDING = 10.0**DECIMALS
#: stale nodes up to which a net score is worked out in plain Python, one node at a time
FEW_NODES = 8


def stranded_milli(
    gpu_free: IntArray | FloatArray,
    cpu_free: IntArray | FloatArray,
    memory_free: IntArray | FloatArray,
    target: TargetWorkload,
) -> FloatArray:
    """GPU milli that the free CPU or memory cannot feed at the workload's average ratios."""
    stranded: FloatArray = np.zeros(np.shape(gpu_free), np.float64)
    for free, per_milli in (
        (cpu_free, target.cpu_per_gpu_milli),
        (memory_free, target.memory_per_gpu_milli),
    ):
        if per_milli > 0:
            stranded = np.maximum(stranded, gpu_free - free / per_milli)
    return stranded


def rounded(score: float) -> float:
    """np.round(score, DECIMALS) of one Python float, bit for bit: numpy multiplies by
    10**DECIMALS, rounds half to even (rint, which keeps the sign of a zero) and divides."""
    scaled = score * ROUNDING
    return math.copysign(round(scaled), scaled) / ROUNDING


class GpupoolPolicy(TargetedPolicy):
    """Highest fragment decrease net of newly stranded GPU milli; ties go to node order."""

    name = "gpupool"

    def __init__(self, *, seed: int, target: TargetWorkload) -> None:
        super().__init__(seed=seed, target=target)
        self.model_bound = any(spec.gpu_models for spec in target.specs)
        largest = max((spec.gpus for spec in target.specs), default=0)
        #: idle nodes with at least this many GPUs are kept for multi-GPU pods (0: none)
        self.keep_idle_gpus = largest if largest > 1 else 0
        #: the widest pods' CPU sizes, largest first (none when the GPU milli per pod is unknown)
        self.sizes = target.widest.sizes if target.gpu_milli_per_pod > 0 else ()
        widest = target.widest
        #: the widest pod's GPUs with the most CPU and host memory any such pod asks, as a size
        self.widest_size = (WideSize(widest.cpu, widest.host_memory, 0.0),)
        #: the state observers' keys for the sizes above (what each counts), made once
        self._wide_keys = {
            id(sizes): (
                "gpupool-wide-idle",
                widest.gpus,
                tuple((z.cpu, z.host_memory) for z in sizes),
            )
            for sizes in (self.sizes, self.widest_size)
        }

    def options(self, state: ClusterState, request: Demand, nodes: IntArray) -> FragmentOptions:
        """FGD's answers, a one-GPU share's GPU chosen with the packing value it loses charged
        (PACKING_WEIGHT milli per milli of a GPU's value); FGD's own where specs are bound to
        models (as the score)."""
        charge = None
        if request.gpus == 1 and request.is_fractional and not self.model_bound:
            prices = share_prices(self.target)
            if prices is not None:
                charge = prices.lost(request.compute, PACKING_WEIGHT * MILLI_PER_GPU)
        return fragment_options(fragment_index(state, self.target), request, nodes, charge)

    def scores_of(self, state: ClusterState, demand: Demand, options: FragmentOptions) -> Scores:
        if self.model_bound:
            return fgd_scores(options)
        nodes = options.nodes
        # the net score of a node changes only when the node does: kept per demand, and worked
        # out again only for the nodes changed since (element by element, so the same values)
        cache = self.net(state)
        answers = cache.answers((demand.shape, demand.host_memory))
        stale = nodes[answers.seen[nodes] != cache.version[nodes]]
        if FEW_NODES >= stale.size > 0:  # usually the one node the last placement changed
            delta = options.answers.delta
            for node in stale.tolist():
                answers.score[node] = self.net_score_of(state, demand, node, float(delta[node]))
            answers.seen[stale] = cache.version[stale]
        elif stale.size:
            answers.score[stale] = self.net_scores(
                state, demand, stale, options.answers.delta[stale]
            )
            answers.seen[stale] = cache.version[stale]
        scores: FloatArray = answers.score[nodes]
        for reserved in (self.reserved(state, demand), self.kept_by_size(state, demand)):
            if reserved is not None:
                scores = scores - RESERVE_PENALTY * reserved[nodes]
        return scores

    def net_scores(
        self, state: ClusterState, demand: Demand, nodes: IntArray, delta: FloatArray
    ) -> FloatArray:
        """The score of `nodes` before the reserves: the fragment decrease `delta` net of the
        GPU milli the demand newly strands there (never a reward on a kept idle node)."""
        gpu = state.gpu_free_total[nodes]
        cpu = state.cpu_free[nodes]
        memory = state.mem_free[nodes]
        before = stranded_milli(gpu, cpu, memory, self.target)
        after = stranded_milli(
            gpu - demand.total_gpu_milli,
            cpu - demand.cpu,
            memory - demand.host_memory,
            self.target,
        )
        change = after - before
        if self.keep_idle_gpus:
            count = state.gpu_count[nodes]
            kept = (state.full_free[nodes] == count) & (count >= self.keep_idle_gpus)
            change = np.where(kept, np.maximum(change, 0.0), change)
        # rounding keeps float noise from splitting nodes that tie
        scores: FloatArray = np.round(delta - STRANDING_WEIGHT * change, DECIMALS)
        return scores

    def net_score_of(self, state: ClusterState, demand: Demand, node: int, delta: float) -> float:
        """`net_scores` of one node in plain Python floats, which costs less than numpy's
        per-call overhead: the same IEEE operations in the same order (np.maximum's choice on
        ties, `rounded` for np.round), so the same bits."""
        gpu = int(state.gpu_free_total[node])
        cpu = int(state.cpu_free[node])
        memory = int(state.mem_free[node])
        change = self._stranded_of(
            gpu - demand.total_gpu_milli, cpu - demand.cpu, memory - demand.host_memory
        ) - self._stranded_of(gpu, cpu, memory)
        if self.keep_idle_gpus and change < 0.0:
            count = int(state.gpu_count[node])
            if int(state.full_free[node]) == count and count >= self.keep_idle_gpus:
                change = 0.0
        return rounded(delta - STRANDING_WEIGHT * change)

    def _stranded_of(self, gpu: int, cpu: int, memory: int) -> float:
        """`stranded_milli` of one node, in plain Python floats."""
        stranded = 0.0
        for free, per_milli in (
            (cpu, self.target.cpu_per_gpu_milli),
            (memory, self.target.memory_per_gpu_milli),
        ):
            if per_milli > 0:
                left = gpu - free / per_milli
                if not stranded >= left:  # np.maximum keeps the first on ties
                    stranded = left
        return stranded

    def reserved(self, state: ClusterState, demand: Demand) -> BoolArray | None:
        """The nodes kept for the workload's widest pods, when `demand` is narrower and no more
        than RESERVED_NODES idle nodes could still take such a pod; None otherwise."""
        widest = self.target.widest
        if widest.gpus < 2 or demand.gpus >= widest.gpus:
            return None
        # the idle nodes able to take it, kept node by node as the state changes
        wide = self.wide_idle(state, self.widest_size)
        return wide.able[:, 0] if wide.counts[0] <= RESERVED_NODES else None

    def kept_by_size(self, state: ClusterState, demand: Demand) -> BoolArray | None:
        """The idle nodes kept for each CPU size of the widest pods that `demand` is not: those
        able to take a pod of that size, when there are no more of them than
        KEPT_PER_EXPECTED_POD x the pods of that size (or more CPU) expected to fill the free
        GPUs; None when no size is that short."""
        widest = self.target.widest
        if widest.gpus < 2 or not self.sizes:
            return None
        wide = self.wide_idle(state, self.sizes)
        # the free GPU milli, the same integer as state.total_gpu_milli - allocated_gpu_milli
        expected = self.net(state).free_milli / self.target.gpu_milli_per_pod
        short = [
            k
            for k, size in enumerate(self.sizes)
            # a pod of this size (or wider) is what the nodes are kept for
            if not (demand.gpus >= widest.gpus and demand.cpu >= size.cpu)
            and 0 < wide.counts[k] <= KEPT_PER_EXPECTED_POD * size.share * expected
        ]
        if not short:
            return None
        kept: BoolArray = np.asarray(wide.able[:, short].any(axis=1), np.bool_)
        return kept

    def wide_idle(self, state: ClusterState, sizes: tuple[WideSize, ...]) -> WideIdle:
        """The state's observer of the idle nodes able to take a widest pod of each of `sizes`
        (self.sizes or self.widest_size), keyed by what it counts."""
        return state.observer(
            self._wide_keys[id(sizes)], lambda: WideIdle(state, self.target.widest.gpus, sizes)
        )

    def net(self, state: ClusterState) -> NetScores:
        """The state's observer that keeps this policy's net scores and the free GPU milli."""
        return state.observer(("gpupool-net", self.target), lambda: NetScores(state))


class WideIdle:
    """Which idle nodes could take a pod of each CPU size of the widest pods, and how many,
    kept up to date node by node as the state changes (a state observer)."""

    def __init__(self, state: ClusterState, gpus: int, sizes: tuple[WideSize, ...]) -> None:
        self.state = state
        self.gpus = gpus
        self.sizes = sizes
        idle = (state.full_free == state.gpu_count) & (state.gpu_count >= gpus)
        self.able: BoolArray = np.stack(
            [
                idle & (state.cpu_free >= size.cpu) & (state.mem_free >= size.host_memory)
                for size in sizes
            ],
            axis=1,
        )
        self.counts: list[int] = [int(n) for n in self.able.sum(axis=0)]
        #: per node, whether it has the GPUs at all (fixed), and whether it is able for a size
        self.big: list[bool] = (state.gpu_count >= gpus).tolist()
        self.any_able: list[bool] = [bool(x) for x in np.any(self.able, axis=1).tolist()]

    def refresh_node(self, node: int) -> None:
        if not self.big[node]:  # never able
            return
        state = self.state
        idle = int(state.full_free[node]) == int(state.gpu_count[node])
        if not idle and not self.any_able[node]:  # was not able, is not now: most changes
            return
        cpu = int(state.cpu_free[node])
        memory = int(state.mem_free[node])
        row = self.able[node]
        for k, size in enumerate(self.sizes):
            able = idle and cpu >= size.cpu and memory >= size.host_memory
            if able != row[k]:
                row[k] = able
                self.counts[k] += 1 if able else -1
        self.any_able[node] = bool(row.any())


@dataclass
class NetAnswers:
    """Per node, for one demand: its net score and the node version it was worked out at
    (-1: never)."""

    score: FloatArray
    seen: IntArray


class NetScores:
    """`gpupool`'s net scores per demand and node, a version per node bumped whenever the node
    changes (what makes a kept score stale), and the cluster's free GPU milli (a state
    observer)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.n = state.n_nodes
        self.version: IntArray = np.zeros(self.n, np.int64)
        self._answers: dict[tuple[object, ...], NetAnswers] = {}
        self._free: list[int] = state.gpu_free_total.tolist()
        #: free GPU milli over all nodes (integers: the same sum in any order)
        self.free_milli = sum(self._free)

    def refresh_node(self, node: int) -> None:
        self.version[node] += 1
        free = int(self.state.gpu_free_total[node])
        self.free_milli += free - self._free[node]
        self._free[node] = free

    def answers(self, key: tuple[object, ...]) -> NetAnswers:
        """The answers kept for a demand (its shape and host memory), as many demands as the
        fragment index keeps answers for."""
        return kept_per_shape(
            self._answers,
            key,
            lambda: NetAnswers(np.zeros(self.n, np.float64), np.full(self.n, -1, np.int64)),
        )
