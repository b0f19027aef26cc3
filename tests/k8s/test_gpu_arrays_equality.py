"""The extender's vectorised answers equal scheduler/gpu_placement's, node by node.

Seeded random fleets: nodes of 1 to 8 GPUs of mixed models and sizes, some unhealthy, partly
used by shared pods (some GPUs with every device slot held), `high` and `low` (a low pod holds
memory and no compute, some beside high pods that hold all of a GPU's compute); random asks:
one or several GPUs, memory in bytes or in proportion, exclusive, a GPU model (present or not),
some too big for any node, a third of them `low` (placed as if every GPU's compute were free,
scheduler/opportunistic.as_seen_by). For every policy the extender offers, each node's fit,
why-not line (never_fits's, or the shortfall of GPUs) and score are compared with what
gpu_placement answers for the same GPUs,
built here from the test's own record of what each pod holds, not from the extender's arrays.
Each fleet is asked twice: with every node (answered over the whole fleet's arrays) and with a
few (answered over a copy of their columns).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from gpupool.core.resources import Mode, Priority
from gpupool.core.units import MILLI_PER_GPU, GiB
from gpupool.k8s.fleet import POLICIES, Charge, Fleet, gpu_request
from gpupool.k8s.gpu_arrays import priorities
from gpupool.k8s.inventory import GpuInfo
from gpupool.k8s.names import SLOTS_PER_GPU
from gpupool.k8s.podspec import GpuAsk
from gpupool.scheduler.gpu_placement import never_fits, place, shortfalls
from gpupool.scheduler.gpus import GpuView
from gpupool.scheduler.opportunistic import as_seen_by, guaranteed_compute

MODELS = {"A100-80GB": 80 * GiB, "A100-40GB": 40 * GiB, "T4": 16 * GiB, "H100-94GB": 94 * GiB}


@dataclass
class Gpu:
    """The test's own record of one GPU and what the pods on it hold."""

    info: GpuInfo
    memory_used: int = 0
    milli_used: int = 0
    pods: int = 0
    #: (milli held, bytes held, priority) per pod: a low pod holds no compute
    held: list[tuple[int, int, Priority]] = field(default_factory=list)

    def view(self) -> GpuView:
        total = self.info.memory
        usable = self.info.healthy and total > 0 and self.pods < SLOTS_PER_GPU
        free = total - self.memory_used
        return GpuView(
            self.info.index, self.info.model, total, free, MILLI_PER_GPU - self.milli_used, usable
        )


@dataclass
class Node:
    name: str
    gpus: list[Gpu] = field(default_factory=list)


def random_fleet(rng: random.Random, nodes: int) -> tuple[Fleet, list[Node]]:
    fleet, record = Fleet(), []
    for n in range(nodes):
        node = Node(f"node-{n}")
        same_model = rng.random() < 0.7
        model = rng.choice(list(MODELS))
        for i in range(rng.randint(1, 8)):
            if not same_model:
                model = rng.choice(list(MODELS))
            healthy = rng.random() > 0.08
            node.gpus.append(Gpu(GpuInfo(i, f"GPU-{n}-{i}", model, MODELS[model], healthy)))
        fleet.set_node(node.name, [gpu.info for gpu in node.gpus])
        for gpu in node.gpus:
            fill(rng, fleet, node.name, gpu)
        record.append(node)
    return fleet, record


def fill(rng: random.Random, fleet: Fleet, node: str, gpu: Gpu) -> None:
    """Pods on one GPU: none, a few shares, a whole GPU, every device slot held, or shares with
    more of the memory than of the compute (memory, not compute, then limits the shapes); then,
    on some GPUs, low pods, which need memory and a device slot but no compute."""
    kind = rng.choice(["empty", "empty", "shares", "shares", "memory", "whole", "slots"])
    if kind == "whole":
        pods = [(MILLI_PER_GPU, gpu.info.memory)]
    elif kind == "slots":
        pods = [(rng.choice([10, 20, 50]), rng.choice([0, 1 * GiB])) for _ in range(10)]
    elif kind == "shares":
        pods = []
        for _ in range(rng.randint(1, 4)):
            milli = rng.choice([100, 250, 300, 500, 750])
            memory = rng.choice([gpu.info.memory * milli // MILLI_PER_GPU, 4 * GiB, 10 * GiB])
            pods.append((milli, memory))
    elif kind == "memory":
        pods = [(rng.choice([50, 100, 200]), gpu.info.memory * rng.choice([30, 55, 80]) // 100)]
    else:
        pods = []
    asks = [(milli, memory, Priority.HIGH) for milli, memory in pods]
    if rng.random() < 0.3:
        for _ in range(rng.randint(1, 3)):
            milli = rng.choice([100, 500, MILLI_PER_GPU])
            asks.append((milli, rng.choice([1 * GiB, 8 * GiB, 20 * GiB]), Priority.LOW))
    for milli, memory, priority in asks:
        held = guaranteed_compute(priority, milli)
        room = MILLI_PER_GPU - gpu.milli_used, gpu.info.memory - gpu.memory_used
        if held <= room[0] and memory <= room[1] and gpu.pods < SLOTS_PER_GPU:
            fleet.charge(Charge(node, (gpu.info.index,), memory, held, False))
            gpu.memory_used += memory
            gpu.milli_used += held
            gpu.pods += 1
            gpu.held.append((held, memory, priority))


def churn(rng: random.Random, fleet: Fleet, record: list[Node]) -> None:
    """Pods come and go on a few nodes (a later pod's answer is the earlier one brought up to
    date there); one node's GPU turns unhealthy (the answers are made anew)."""
    for node in rng.sample(record, rng.choice([1, 3, 12])):
        for gpu in node.gpus:
            while gpu.held and rng.random() < 0.5:
                milli, memory, _ = gpu.held.pop()
                charge = Charge(node.name, (gpu.info.index,), memory, milli, False)
                fleet.charge(charge, -1)
                gpu.memory_used -= memory
                gpu.milli_used -= milli
                gpu.pods -= 1
            fill(rng, fleet, node.name, gpu)
    if rng.random() < 0.5:
        node = rng.choice(record)
        gpu = rng.choice(node.gpus)
        gpu.info = GpuInfo(gpu.info.index, gpu.info.uuid, gpu.info.model, gpu.info.memory, False)
        fleet.set_node(node.name, [gpu.info for gpu in node.gpus])


def random_ask(rng: random.Random) -> GpuAsk:
    gpus = rng.choice([1, 1, 1, 2, 2, 3, 4, 8, 9])
    model = rng.choice([None, None, None, *MODELS, "V100"])
    if rng.random() < 0.2:
        return GpuAsk(gpus, None, MILLI_PER_GPU, Mode.EXCLUSIVE, gpu_model=model)
    memory = rng.choice([None, None, 1 * GiB, 8 * GiB, 20 * GiB, 40 * GiB, 90 * GiB, 200 * GiB])
    compute = rng.choice([10, 100, 250, 300, 500, 700, 1000])
    priority = rng.choice([Priority.HIGH, Priority.HIGH, Priority.LOW])
    return GpuAsk(gpus, memory, compute, priority=priority, gpu_model=model)


def check(fleet: Fleet, record: list[Node], ask: GpuAsk) -> None:
    names = [node.name for node in record]
    request = gpu_request(ask)
    fit, failed, unresolvable = fleet.filter(ask, names)
    assert set(fit) | set(failed) | set(unresolvable) == set(names)
    by_policy = {policy: fleet.node_scores(ask, names, policy) for policy in POLICIES}
    ints = {policy: fleet.scores(ask, names, policy) for policy in POLICIES}
    for i, node in enumerate(record):
        views = list(as_seen_by(ask.priority, [gpu.view() for gpu in node.gpus]))
        where = f"{node.name} {ask} {views}"
        placements = {policy: place(request, views, policy) for policy in POLICIES}
        fits = placements["gpupool"].fits
        assert (node.name in fit) == fits, where
        if not fits:
            never = never_fits(request, views)
            if never is not None:
                assert unresolvable[node.name] == never, where
            else:
                assert failed[node.name] == str(shortfalls(request, views)[-1]), where
        for policy, placement in placements.items():
            fits_here, scores = by_policy[policy]
            assert bool(fits_here[i]) == fits, (policy, where)
            if fits:
                assert placement.score is not None
                assert scores[i] == pytest.approx(placement.score, abs=1e-6), (policy, where)
                expected = int(priorities(np.array([placement.score]))[0])
                assert ints[policy][i] == expected, (policy, where)
            else:
                assert ints[policy][i] == 0


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_answers_equal_gpu_placement(seed: int) -> None:
    rng = random.Random(seed)
    fleet, record = random_fleet(rng, 60)
    asks = [random_ask(rng) for _ in range(6)]  # fewer than the answers the fleet keeps
    for _ in range(5):
        for ask in asks:
            check(fleet, record, ask)
            check(fleet, rng.sample(record, 7), ask)
        churn(rng, fleet, record)


def test_the_fleets_cover_what_they_claim() -> None:
    """The random fleets hold every case the comparison is meant to meet (else it proves
    less than it says)."""
    rng = random.Random(0)
    fleet, record = random_fleet(rng, 60)
    gpus = [gpu for node in record for gpu in node.gpus]
    assert any(not gpu.info.healthy for gpu in gpus)
    assert any(gpu.pods >= SLOTS_PER_GPU for gpu in gpus)
    assert any(0 < gpu.milli_used < MILLI_PER_GPU for gpu in gpus)
    assert any(
        gpu.memory_used / gpu.info.memory > 2 * gpu.milli_used / MILLI_PER_GPU > 0 for gpu in gpus
    )
    assert any(len({gpu.info.model for gpu in node.gpus}) > 1 for node in record)
    # low pods beside high pods that hold all of the GPU's compute
    assert any(
        gpu.milli_used == MILLI_PER_GPU and any(p is Priority.LOW for _, _, p in gpu.held)
        for gpu in gpus
    )
    names = [node.name for node in record]
    outcomes = {"fit": 0, "failed": 0, "never": 0}
    gained = 0
    for _ in range(25):
        ask = random_ask(rng)
        fit, failed, never = fleet.filter(ask, names)
        # the same ask at low passes nodes where at high it fails (for compute held there)
        low = fleet.filter(replace(ask, priority=Priority.LOW), names)[0]
        high = fleet.filter(replace(ask, priority=Priority.HIGH), names)[0]
        gained += len(set(low) - set(high))
        outcomes["fit"] += len(fit)
        outcomes["failed"] += len(failed)
        outcomes["never"] += len(never)
    assert min(outcomes.values()) > 20, outcomes
    assert gained > 10, gained
