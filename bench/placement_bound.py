"""A lower bound on unallocated GPU % for each workload of the Alibaba trace, seed and arrived %.

For each workload file, seed (its arrival order, the FGD paper's procedure) and arrived % X, the
pods that have arrived by the end of bin X are handed to the pattern LP of placement_bound_lp.py,
whose value U no placement of them can beat (the argument is in that module's docstring). The
replay reports, for bin X, the mean over the bin's pod events of the allocated milli, and after
event i at most min(arrived milli by i, U) is allocated (the pods of a prefix are a subset of
those of the bin's last event). So

    bound(X) = 100 - mean over the events i of bin X of min(arrived_i, U) / cluster milli * 100

is a lower bound on the replay's unallocated GPU % at X for every online policy, and also for any
offline one that may not move pods. Pods that fit nowhere count as arrived and never allocated,
as in the replay.

    .venv/bin/python bench/placement_bound.py [--workloads A,B] [--arrived 90,95,100,110,130]
        [--seeds 42-44] [--trace-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import scipy  # noqa: F401
except ImportError:  # the test extra brings it; the package itself does not need it
    sys.exit("bench/placement_bound.py needs scipy: pip install -e '.[test]'")

from placement_bound_lp import Bound, placement_bound

from gpupool.core.errors import GpupoolError
from gpupool.core.resources import NodeSpec, Request
from gpupool.core.units import parse_int_range
from gpupool.sim import procedure, trace

DEFAULT_ARRIVED = (90, 95, 100, 110, 130)


def bin_events(arrived_milli: np.ndarray, cluster: int, pct: int) -> np.ndarray:
    """Indices of the pod events the replay averages for arrived % `pct` (the rounded
    arrived %, or the events within +-1 when no event rounds to it, as metrics.curves does)."""
    arrived_pct = arrived_milli / cluster * 100.0
    inside = np.flatnonzero(np.rint(arrived_pct) == pct)
    if inside.size:
        return inside
    return np.flatnonzero(np.abs(arrived_pct - pct) <= 1.0)


def bound_at(
    nodes: Sequence[NodeSpec],
    order: Sequence[Request],
    pct: int,
    must_place: frozenset[int] = frozenset(),
) -> tuple[float, Bound | None]:
    """(lower bound on unallocated GPU % at arrived % `pct`, the LP's result for the prefix)."""
    cluster = trace.cluster_gpu_milli(nodes)
    arrived = np.cumsum([pod.total_gpu_milli for pod in order])
    events = bin_events(arrived, cluster, pct)
    if not events.size:
        return float("nan"), None
    result = placement_bound(nodes, order[: int(events[-1]) + 1], must_place)
    allocated = np.minimum(arrived[events], result.upper)
    # never below 0: the LP's value may pass the cluster's milli by its solver's tolerance
    return max(0.0, 100.0 - float(allocated.mean()) / cluster * 100.0), result


def run(
    trace_dir: Path,
    workloads: Sequence[str],
    seeds: Sequence[int],
    arrived: Sequence[int],
    must_place: frozenset[int] = frozenset(),
) -> dict[str, dict[int, list[tuple[float, Bound | None]]]]:
    nodes = trace.load_nodes(trace_dir)
    cluster = trace.cluster_gpu_milli(nodes)
    found: dict[str, dict[int, list[tuple[float, Bound | None]]]] = {}
    for workload in workloads:
        pods = trace.load_workload(trace_dir, workload)
        found[workload] = {pct: [] for pct in arrived}
        for seed in seeds:
            order = procedure.arrival_order(pods, cluster, seed)
            for pct in arrived:
                found[workload][pct].append(bound_at(nodes, order, pct, must_place))
                _progress(workload, seed, pct, found[workload][pct][-1])
    return found


def _progress(workload: str, seed: int, pct: int, got: tuple[float, Bound | None]) -> None:
    value, result = got
    if result is None:
        print(f"{workload} seed {seed} @{pct}: no event", file=sys.stderr, flush=True)
        return
    print(
        f"{workload} seed {seed} @{pct}: bound {value:.3f} % unallocated "
        f"(LP {result.rounds} rounds, {result.seconds:.1f} s)",
        file=sys.stderr,
        flush=True,
    )


def explain(title: str, result: Bound, cluster: int) -> list[str]:
    """Where the LP's solution leaves GPU milli unallocated: the pods it leaves out, by GPU
    size, and per node type the GPUs it leaves empty or part-filled (% of the cluster)."""

    def pct(milli: float) -> str:
        return f"{milli / cluster * 100:.3f}"

    by_size: dict[tuple[int, int], float] = {}
    for shape, count in result.left_out.items():
        key = (shape.gpus, shape.milli)
        by_size[key] = by_size.get(key, 0.0) + count * shape.value
    lines = [f"{title}: pods left out (GPUs x milli: % of cluster)"]
    lines += [f"  {g} x {m}: {pct(v)}" for (g, m), v in sorted(by_size.items()) if v >= 1]
    lines.append(f"{title}: idle per node type (CPU, memory GiB, GPUs, model: empty, part)")
    for kind, (empty, part) in result.idle.items():
        if empty + part >= 1:
            memory = kind.memory >> 30
            lines.append(
                f"  {kind.cpu // 1000}, {memory}, {kind.gpus}, {kind.model}: "
                f"{pct(max(empty, 0.0))}, {pct(max(part, 0.0))}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, default=trace.default_trace_dir())
    parser.add_argument("--workloads", help="comma-separated (default: every file)")
    parser.add_argument("--arrived", default=",".join(map(str, DEFAULT_ARRIVED)))
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--json", action="store_true", help="print {workload: {arrived: bound}}")
    parser.add_argument(
        "--explain", action="store_true", help="where the bound leaves GPUs idle (first seed)"
    )
    parser.add_argument(
        "--must-place",
        default="",
        help="what-if: every fractional pod of these milli sizes is placed (not a bound for "
        "policies that may leave one out)",
    )
    args = parser.parse_args(argv)
    if args.trace_dir is None:
        parser.error("the trace was not found: give --trace-dir")
    started = time.perf_counter()
    try:
        workloads = (
            args.workloads.split(",") if args.workloads else trace.workload_names(args.trace_dir)
        )
        for name in workloads:
            trace.workload_path(args.trace_dir, name)
        arrived = parse_int_range(args.arrived, "arrived %")
        forced = frozenset(parse_int_range(args.must_place, "milli")) if args.must_place else None
        seeds = parse_int_range(args.seeds, "seeds")
        found = run(args.trace_dir, workloads, seeds, arrived, forced or frozenset())
    except GpupoolError as err:
        parser.error(str(err))
    means = {
        w: {pct: float(np.nanmean([v for v, _ in runs])) for pct, runs in per.items()}
        for w, per in found.items()
    }
    if args.json:
        print(
            json.dumps({w: {str(p): round(v, 3) for p, v in m.items()} for w, m in means.items()})
        )
    else:
        for workload, per in means.items():
            cells = "  ".join(f"@{p}: {v:.2f}" for p, v in per.items())
            print(f"{workload:12s} {cells}")
    if args.explain:
        cluster = trace.cluster_gpu_milli(trace.load_nodes(args.trace_dir))
        for workload, per in found.items():
            for pct, runs in per.items():
                if runs[0][1] is not None:
                    print("\n".join(explain(f"{workload} @{pct}", runs[0][1], cluster)))
    print(f"{time.perf_counter() - started:.0f} s in all", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
