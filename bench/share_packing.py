"""How well a policy pairs shares on GPUs: a replay to an arrived %, then what each GPU holding
one-GPU shares holds, the compute left on them, and how few GPUs those same shares need.

The bound packs the shares the policy placed onto as few GPUs as possible (an integer program
over every set of sizes that fits one GPU, solved by scipy's HiGHS, which the test extra
installs), ignoring nodes, CPU and the order of arrival: what pairing alone could still save.

    .venv/bin/python bench/share_packing.py [--workload default] [--policy gpupool,fgd]
        [--seed 42] [--arrived 100]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

try:
    from scipy.optimize import LinearConstraint, milp
except ImportError:  # the test extra brings it; the package itself does not need it
    sys.exit("bench/share_packing.py needs scipy: pip install -e '.[test]'")

from gpupool.core.units import MILLI_PER_GPU
from gpupool.scheduler import ClusterState, TargetWorkload, demand_of, make_policy, place
from gpupool.sim import procedure, trace


def shares_per_gpu(
    trace_dir: Path, workload: str, policy: str, seed: int, arrived_pct: float
) -> tuple[list[tuple[int, ...]], float]:
    """The one-GPU shares on each GPU that holds any, after the pods arrived up to
    `arrived_pct` % of the cluster's GPU milli; and the unallocated % of the cluster then."""
    nodes = trace.load_nodes(trace_dir)
    pods = trace.load_workload(trace_dir, workload)
    cluster = trace.cluster_gpu_milli(nodes)
    chooser = make_policy(policy, seed=seed, target_workload=TargetWorkload.from_requests(pods))
    state = ClusterState(nodes)
    held: dict[tuple[int, int], list[int]] = {}
    arrived = 0
    for pod in procedure.arrival_order(pods, cluster, seed):
        arrived += pod.total_gpu_milli
        if arrived > cluster * arrived_pct / 100:
            break
        demand = demand_of(pod)
        placement = place(state, demand, chooser)
        if placement is None:
            continue
        state.allocate(demand, placement)
        if demand.gpus == 1 and demand.is_fractional:
            held.setdefault((placement.node, placement.gpus[0]), []).append(demand.compute)
    unallocated = 100 - 100 * state.allocated_gpu_milli / cluster
    return [tuple(sorted(sizes, reverse=True)) for sizes in held.values()], unallocated


def fewest_gpus(gpus: list[tuple[int, ...]]) -> int:
    """The fewest GPUs that hold all these shares (optimal, by integer programming)."""
    counts = Counter(size for sizes in gpus for size in sizes)
    sizes = sorted(counts, reverse=True)
    patterns: list[list[int]] = []

    def extend(i: int, room: int, taken: list[int]) -> None:
        if i == len(sizes):
            if any(taken):
                patterns.append(taken)
            return
        for k in range(min(room // sizes[i], counts[sizes[i]]), -1, -1):
            extend(i + 1, room - k * sizes[i], [*taken, k])

    extend(0, MILLI_PER_GPU, [])
    columns = np.array(patterns, np.float64).T
    need = np.array([counts[s] for s in sizes], np.float64)
    result = milp(
        np.ones(columns.shape[1]),
        constraints=LinearConstraint(columns, lb=need, ub=np.inf),
        integrality=np.ones(columns.shape[1]),
    )
    if result.status != 0:
        raise SystemExit(f"the packing program was not solved: {result.message}")
    return round(result.fun)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--workload", default="default")
    parser.add_argument("--policy", default="gpupool,fgd", help="comma list")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--arrived", type=float, default=100.0, help="arrived %% to stop at")
    parser.add_argument("--top", type=int, default=10, help="GPU contents listed")
    args = parser.parse_args()
    trace_dir = args.trace_dir or trace.default_trace_dir()
    if trace_dir is None:
        print(f"no trace at {trace.DEFAULT_TRACE_RELPATH}; get it from {trace.TRACE_URL}")
        return 2
    for policy in args.policy.split(","):
        gpus, unallocated = shares_per_gpu(
            trace_dir, args.workload, policy, args.seed, args.arrived
        )
        used = sum(sum(sizes) for sizes in gpus)
        left = len(gpus) * MILLI_PER_GPU - used
        best = fewest_gpus(gpus)
        print(
            f"{policy}, {args.workload}, seed {args.seed}, {args.arrived:g} % arrived: "
            f"{unallocated:.2f} % of the cluster unallocated; {len(gpus)} GPUs hold one-GPU "
            f"shares with {left:,} milli left on them; the fewest GPUs for those shares: {best} "
            f"({(len(gpus) - best) * MILLI_PER_GPU:,} milli more)"
        )
        waste = Counter[tuple[int, ...]]()
        count = Counter(gpus)
        for sizes, n in count.items():
            waste[sizes] = n * (MILLI_PER_GPU - sum(sizes))
        print("  what a GPU holds: GPUs, milli left on them")
        for sizes, milli in waste.most_common(args.top):
            print(f"    {' + '.join(map(str, sizes)):20s} {count[sizes]:5d} {milli:9,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
