"""One engine: a seeded sequence of shares lands on the same GPUs through the node daemon's
queue, the Kubernetes extender (over HTTP) and the trace replay's place/allocate."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.agent.node import free_now
from gpupool.agent.queue import plan
from gpupool.core.resources import NodeSpec
from gpupool.core.units import GiB, parse_bytes
from gpupool.k8s import names
from gpupool.k8s.extender import Extender
from gpupool.k8s.inventory import GpuInfo, encode
from gpupool.k8s.kubeapi import InMemoryKube
from gpupool.scheduler import POLICY_NAMES, ClusterState, make_policy, place
from gpupool.scheduler.gpus import GpuRequest, GpuView
from gpupool.scheduler.workload import PRIOR

sys.path.insert(0, str(Path(__file__).parent / "k8s"))
from k8s_support import ExtenderServer, gpu_pod

GPUS = 4
MEMORY = 40 * GiB
#: shares drawn per policy: enough to fill the node and have some refused
COUNT = 14
#: `random` draws from its own generator: each entry point holds it for a different span
DETERMINISTIC = [name for name in POLICY_NAMES if name != "random"]

Shape = tuple[int, int, str]  # GPUs, compute milli, memory


def shapes(seed: int) -> list[Shape]:
    rng = random.Random(seed)
    return [
        (rng.choice((1, 1, 1, 2)), rng.choice((250, 500, 750, 1000)), rng.choice(("4Gi", "12Gi")))
        for _ in range(COUNT)
    ]


def by_daemon(policy: str, sequence: list[Shape]) -> list[tuple[int, ...] | None]:
    """Each share submitted alone to the daemon's queue rule, beside the ones it started."""
    capacity = tuple(GpuView.idle(i, "A100", MEMORY) for i in range(GPUS))
    running: list[Job] = []
    chosen: list[tuple[int, ...] | None] = []
    for i, (gpus, compute, memory) in enumerate(sequence):
        spec = JobSpec(("true",), gpus=gpus, compute=compute, memory=memory)
        queued = Job(i, spec, 0, "u", State.QUEUED, float(i), (), ())
        decided = plan([queued], running, free_now(capacity, running), capacity, policy, PRIOR)
        if not decided.starts:
            chosen.append(None)
            continue
        start = decided.starts[0]
        running.append(
            Job(i, spec, 0, "u", State.RUNNING, float(i), start.gpus, start.memory, started_at=i)
        )
        chosen.append(start.gpus)
    return chosen


def by_extender(policy: str, sequence: list[Shape]) -> list[tuple[int, ...] | None]:
    """Each share a pod bound to the one node through the extender's HTTP /bind."""
    api = InMemoryKube()
    inventory = [GpuInfo(i, f"GPU-{i}", "A100", MEMORY) for i in range(GPUS)]
    api.add_node("node-0", {names.ANN_NODE_GPUS: encode(inventory)})
    for i, (gpus, compute, memory) in enumerate(sequence):
        api.add_pod(gpu_pod(f"p{i}", str(gpus), memory, str(compute // 10)))
    chosen: list[tuple[int, ...] | None] = []
    with ExtenderServer(Extender(api, policy)) as http:
        for i in range(len(sequence)):
            args = {"podName": f"p{i}", "podNamespace": "default", "podUID": f"uid-default-p{i}"}
            answer = http.post("/bind", json={**args, "node": "node-0"}).json()
            pod = api.pods[("default", f"p{i}")]
            if answer.get("error"):
                chosen.append(None)
            else:
                chosen.append(
                    tuple(int(g) for g in pod["metadata"]["annotations"][names.ANN_GPUS].split(","))
                )
                pod["status"] = {"phase": "Running"}  # the kubelet admitted it
    return chosen


def by_replay(policy: str, sequence: list[Shape]) -> list[tuple[int, ...] | None]:
    """The trace replay's loop: place, then allocate, on a one-node cluster state."""
    state = ClusterState([NodeSpec("n", 64_000, 256 * GiB, GPUS, "A100", MEMORY)])
    chooser = make_policy(policy, seed=0, target_workload=PRIOR)
    chosen: list[tuple[int, ...] | None] = []
    for gpus, compute, memory in sequence:
        request = GpuRequest(gpus, compute, parse_bytes(memory))
        placement = place(state, request, chooser)
        if placement is None:
            chosen.append(None)
            continue
        state.allocate(request, placement)
        chosen.append(placement.gpus)
    return chosen


@pytest.mark.parametrize("policy", DETERMINISTIC)
def test_one_sequence_lands_on_the_same_gpus_everywhere(policy: str) -> None:
    sequence = shapes(seed=11)
    replayed = by_replay(policy, sequence)
    assert by_daemon(policy, sequence) == replayed
    assert by_extender(policy, sequence) == replayed
    assert None in replayed and any(replayed)  # some placed, some refused: both paths ran
