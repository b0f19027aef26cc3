"""A small deterministic cluster and workload shaped like the Alibaba trace, for demos and tests."""

from __future__ import annotations

import numpy as np

from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import MILLI_PER_GPU, GiB

#: the workload name the synthetic scenario answers to
SYNTHETIC_WORKLOAD = "synthetic"

# (model, GPUs per node, CPU milli, host memory GiB, nodes per unit of scale): mixed models and
# node shapes, as in the trace, so that model constraints and CPU pressure both matter.
_NODE_SHAPES = (
    ("A100", 8, 96_000, 768, 6),
    ("V100M32", 8, 96_000, 512, 4),
    ("T4", 4, 64_000, 256, 8),
    ("P100", 2, 64_000, 256, 4),
    ("A10", 1, 32_000, 128, 2),
)

# Fractional shares seen most in the trace (milli-GPU); the weights favour the common ones.
_SHARES = np.array([100, 200, 250, 300, 400, 500, 600, 700, 800, 900])
_SHARE_WEIGHTS = np.array([6, 8, 10, 8, 8, 14, 6, 5, 4, 3], dtype=np.float64)
_MULTI_GPU = np.array([2, 4, 8])
_MULTI_WEIGHTS = np.array([5, 3, 2], dtype=np.float64)
_MODEL_CHOICES: tuple[tuple[str, ...], ...] = (
    ("A100",),
    ("V100M32",),
    ("T4",),
    ("V100M32", "A100"),
    ("P100", "T4"),
)


#: the default size: 96 nodes, 488 GPUs, about 870 arriving pods (a run takes a tenth of a second)
DEFAULT_SCALE = 4


def synthetic_nodes(scale: int = DEFAULT_SCALE) -> list[NodeSpec]:
    """`scale` times 24 nodes of five GPU models (122 GPUs per unit of scale)."""
    nodes: list[NodeSpec] = []
    for model, gpus, cpu, memory_gib, count in _NODE_SHAPES:
        for _ in range(count * scale):
            nodes.append(
                NodeSpec(
                    name=f"syn-node-{len(nodes):04d}",
                    cpu=cpu,
                    host_memory=memory_gib * GiB,
                    gpu_count=gpus,
                    gpu_model=model,
                )
            )
    return nodes


def _draw_pod(rng: np.random.Generator, index: int) -> Request:
    """One pod: 12 % CPU-only, 38 % fractional, 47 % one whole GPU, 3 % multi-GPU."""
    kind = rng.choice(4, p=[0.12, 0.38, 0.47, 0.03])
    cpu = int(rng.choice([1000, 2000, 4000, 8000, 12000, 16000]))
    memory = int(rng.choice([4, 8, 16, 32, 64])) * GiB
    models: tuple[str, ...] = ()
    # Only one-GPU pods name models: a multi-GPU pod tied to a small node shape could never fit.
    if kind in (1, 2) and rng.random() < 0.06:
        models = _MODEL_CHOICES[int(rng.integers(len(_MODEL_CHOICES)))]
    gpus, compute = 0, MILLI_PER_GPU
    if kind == 1:
        gpus = 1
        compute = int(rng.choice(_SHARES, p=_SHARE_WEIGHTS / _SHARE_WEIGHTS.sum()))
    elif kind == 2:
        gpus = 1
    elif kind == 3:
        gpus = int(rng.choice(_MULTI_GPU, p=_MULTI_WEIGHTS / _MULTI_WEIGHTS.sum()))
        cpu = 8000 * gpus  # fits the 8-GPU nodes' 96 cores, as the trace's multi-GPU pods do
    return Request(
        name=f"syn-pod-{index:05d}",
        cpu=cpu,
        host_memory=memory,
        gpus=gpus,
        compute=compute,
        gpu_models=models,
    )


def synthetic_workload(
    scale: int = DEFAULT_SCALE, load_pct: int = 95, seed: int = 0
) -> list[Request]:
    """Pods drawn with `seed` until they ask for `load_pct` % of the scaled cluster's GPU milli."""
    cluster_milli = sum(node.gpu_count for node in synthetic_nodes(scale)) * MILLI_PER_GPU
    target = cluster_milli * load_pct // 100
    rng = np.random.default_rng(seed)
    pods: list[Request] = []
    total = 0
    while total < target:
        pod = _draw_pod(rng, len(pods))
        pods.append(pod)
        total += pod.total_gpu_milli
    return pods
