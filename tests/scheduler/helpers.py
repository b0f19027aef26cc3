"""Small hand-built clusters and a naive FGD fragment, straight from the procedure's words."""

from __future__ import annotations

from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import GiB
from gpupool.scheduler import ClusterState, TargetWorkload
from gpupool.scheduler.workload import PodSpec


def three_nodes() -> list[NodeSpec]:
    """n0: 2 GPUs of model A; n1: 4 of model B; n2: 8 of model A with little CPU."""
    return [
        NodeSpec("n0", cpu=32_000, host_memory=64 * GiB, gpu_count=2, gpu_model="A"),
        NodeSpec("n1", cpu=64_000, host_memory=128 * GiB, gpu_count=4, gpu_model="B"),
        NodeSpec("n2", cpu=16_000, host_memory=32 * GiB, gpu_count=8, gpu_model="A"),
    ]


def share(milli: int, cpu: int = 1000, memory: int = 0, models: tuple[str, ...] = ()) -> Request:
    return Request(gpus=1, compute=milli, cpu=cpu, host_memory=memory, gpu_models=models)


def whole(gpus: int, cpu: int = 1000, memory: int = 0, models: tuple[str, ...] = ()) -> Request:
    return Request(gpus=gpus, compute=1000, cpu=cpu, host_memory=memory, gpu_models=models)


def cpu_only(cpu: int = 1000, memory: int = 0) -> Request:
    return Request(gpus=0, cpu=cpu, host_memory=memory)


def small_target() -> TargetWorkload:
    """m1: a 500-milli share (p 0.5); m2: one whole GPU (0.25); m3: CPU-only (0.25)."""
    return TargetWorkload(
        specs=(
            PodSpec(cpu=1000, gpu_milli=500, gpus=1, gpu_models=()),
            PodSpec(cpu=1000, gpu_milli=1000, gpus=1, gpu_models=()),
            PodSpec(cpu=1000, gpu_milli=0, gpus=0, gpu_models=()),
        ),
        probabilities=(0.5, 0.25, 0.25),
    )


def naive_fragment(state: ClusterState, node: int, target: TargetWorkload) -> float:
    """F_n computed spec by spec and GPU by GPU, as FGD_PROCEDURE.md words it."""
    spec_node = state.nodes[node]
    free = [int(state.gpu_free[node, i]) for i in range(spec_node.gpu_count)]
    total = sum(free)
    cpu = int(state.cpu_free[node])
    result = 0.0
    for spec, p in zip(target.specs, target.probabilities, strict=True):
        if spec.gpus == 0 or (spec.gpu_models and spec_node.gpu_model not in spec.gpu_models):
            fragment = total
        elif sum(g >= spec.gpu_milli for g in free) >= spec.gpus and cpu >= spec.cpu:
            fragment = sum(g for g in free if g < spec.gpu_milli)
        else:
            fragment = total
        result += p * fragment
    return result
