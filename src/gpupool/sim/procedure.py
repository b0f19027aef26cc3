"""The FGD paper's arrival procedure: sort by name, shuffle by seed, inflate or trim to 130 %."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Request

#: the paper's "tune 1.3": pods arrive until they ask for 130 % of the cluster's GPU milli
TARGET_PCT = 130


def gpu_milli_limit(cluster_milli: int, target_pct: int = TARGET_PCT) -> int:
    """GPU milli that the arriving pods may ask for in all (exact integer arithmetic)."""
    return cluster_milli * target_pct // 100


def arrival_order(
    pods: Sequence[Request], cluster_milli: int, seed: int, *, target_pct: int = TARGET_PCT
) -> list[Request]:
    """The pods in the order they arrive for one run with `seed`.

    Sorted by name, shuffled with numpy's default_rng(seed); then, below the limit, clones drawn
    uniformly with replacement are appended until the next one would pass it; above the limit
    (the multigpu workloads), random pods are dropped until the rest fits.
    """
    if not pods:
        raise InvalidRequest("empty workload: no pods to replay")
    if cluster_milli <= 0:
        raise InvalidRequest(f"invalid cluster GPU milli {cluster_milli}: the cluster has no GPUs")
    rng = np.random.default_rng(seed)
    ordered = sorted(pods, key=lambda pod: pod.name)
    shuffled = [ordered[i] for i in rng.permutation(len(ordered))]
    limit = gpu_milli_limit(cluster_milli, target_pct)
    total = sum(pod.total_gpu_milli for pod in shuffled)
    if total == 0:
        raise InvalidRequest("workload asks for no GPU: nothing to inflate to the target")
    if total > limit:
        return _trim(shuffled, total, limit, rng)
    return shuffled + _clones(shuffled, total, limit, rng)


def _clones(
    originals: list[Request], total: int, limit: int, rng: np.random.Generator
) -> list[Request]:
    clones: list[Request] = []
    count = len(originals)
    while True:
        # Draws come in batches: one generator call per pod would dominate the procedure's time.
        for index in rng.integers(count, size=256):
            pod = originals[index]
            if total + pod.total_gpu_milli > limit:
                return clones
            total += pod.total_gpu_milli
            clones.append(dataclasses.replace(pod, name=f"{pod.name}-clone-{len(clones) + 1}"))


def _trim(pods: list[Request], total: int, limit: int, rng: np.random.Generator) -> list[Request]:
    dropped = np.zeros(len(pods), dtype=bool)
    for index in rng.permutation(len(pods)):
        if total <= limit:
            break
        dropped[index] = True
        total -= pods[index].total_gpu_milli
    return [pod for pod, drop in zip(pods, dropped, strict=True) if not drop]
