"""Benchmark: one placement decision on a 10,000-node cluster (p50/p99 ms), for the Kubernetes
extender's budget, and the node daemon's placement of one job on an 8-GPU node. Writes
docs/benchmarks/placement-latency.md.

The cluster is the synthetic trace-shaped one (five GPU models, 1-8 GPUs per node) scaled to
10,008 nodes, filled to about 70 % of its GPU milli by the `random` policy so that GPUs, CPU and
memory are fragmented as in a busy cluster. Then each policy places the same stream of pods
from the same state, one decision at a time; only `ClusterState.place` is timed, and each
placement is then allocated so the cluster keeps filling (to about 80 %).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gpupool.core.resources import Request
from gpupool.core.units import GiB
from gpupool.scheduler import (
    POLICY_NAMES,
    ClusterState,
    TargetWorkload,
    fragment_index,
    gpu_placement,
    make_policy,
    place,
)
from gpupool.scheduler.gpus import GpuRequest, GpuView
from gpupool.scheduler.workload import PRIOR
from gpupool.sim.synthetic import synthetic_nodes, synthetic_workload

#: 24 nodes per unit of scale: 417 units = 10,008 nodes
SCALE = 417
FILL_PCT = 70
REPO = Path(__file__).resolve().parents[1]


def filled_cluster(seed: int) -> tuple[ClusterState, list[Request]]:
    """The cluster filled to FILL_PCT % by `random`, and the pods that will arrive next."""
    nodes = synthetic_nodes(SCALE)
    state = ClusterState(nodes)
    filler = make_policy("random", seed=seed)
    for pod in synthetic_workload(SCALE, load_pct=FILL_PCT, seed=seed):
        placement = place(state, pod, filler)
        if placement is not None:
            state.allocate(pod, placement)
    return state, synthetic_workload(SCALE, load_pct=100, seed=seed + 1)


def measure(
    policy_name: str, decisions: int, warmup: int, seed: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """Milliseconds per decision during warm-up and after it, and the GPU allocation % after."""
    state, arriving = filled_cluster(seed)
    target = TargetWorkload.from_requests(arriving)
    policy = make_policy(policy_name, seed=seed, target_workload=target)
    fragment_index(state, target)  # built once, as a long-running scheduler would
    times = np.empty(warmup + decisions)
    for i, pod in enumerate(arriving[: warmup + decisions]):
        start = time.perf_counter()
        placement = place(state, pod, policy)
        times[i] = (time.perf_counter() - start) * 1000
        if placement is not None:
            state.allocate(pod, placement)
    allocated = state.allocated_gpu_milli / state.total_gpu_milli * 100
    return times[:warmup], times[warmup:], allocated


def daemon_times(policy_name: str, decisions: int, seed: int) -> np.ndarray:
    """Milliseconds per `gpu_placement.place` (the daemon's call) for one job on an 8-GPU node
    whose GPUs are partly taken, as the daemon makes it: node state, policy, choice."""
    rng = np.random.default_rng(seed)
    times = np.empty(decisions)
    for i in range(decisions):
        free = rng.integers(0, 11, 8) * 100
        node = [
            GpuView(g, "A100-80GB", 80 * GiB, int(f) * 80 * GiB // 1000, int(f))
            for g, f in enumerate(free)
        ]
        request = GpuRequest(int(rng.choice([1, 1, 1, 2])), int(rng.choice([100, 250, 500])))
        start = time.perf_counter()
        gpu_placement.place(request, node, policy_name, PRIOR)
        times[i] = (time.perf_counter() - start) * 1000
    return times


def daemon_table(decisions: int, seed: int) -> str:
    rows = []
    for name in POLICY_NAMES:
        daemon_times(name, 50, seed)  # warm: imports, numpy's first calls
        times = daemon_times(name, decisions, seed)
        p50, p99 = np.percentile(times, [50, 99])
        rows.append(f"| {name} | {decisions} | {p50:.3f} | {p99:.3f} | {times.max():.2f} |")
    return "\n".join(
        ["| policy | decisions | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|", *rows]
    )


# One replay of `fgd` on the trace's `default` workload in a fresh process, so that its peak
# memory is its own. Prints a JSON object: seconds of the replay, pods, peak RSS in bytes.
_REPLAY_SCRIPT = """
import json, resource, sys
from pathlib import Path
from gpupool.scheduler import TargetWorkload
from gpupool.sim import procedure, trace
from gpupool.sim.replay import replay
trace_dir = Path(sys.argv[1])
nodes = trace.load_nodes(trace_dir)
pods = trace.load_workload(trace_dir, "default")
arriving = procedure.arrival_order(pods, trace.cluster_gpu_milli(nodes), 42)
result = replay(nodes, arriving, sys.argv[2], 42, TargetWorkload.from_requests(pods))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": result.seconds, "pods": len(arriving), "peak_rss": peak}))
"""


def replay_rows(trace_dir: Path | None) -> list[str]:
    """Rows `fgd` and `gpupool` on `default`, seed 42; none when the trace is not there."""
    if trace_dir is None or not trace_dir.is_dir():
        return []
    rows = []
    for policy in ("fgd", "gpupool"):
        done = subprocess.run(
            [sys.executable, "-c", _REPLAY_SCRIPT, str(trace_dir), policy],
            capture_output=True,
            text=True,
            check=True,
        )
        got = json.loads(done.stdout)
        rows.append(
            f"| {policy} | {got['pods']} | {got['seconds']:.2f} | {got['peak_rss'] / 2**20:.0f} |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=1000)
    parser.add_argument("--policies", default="gpupool,fgd")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--daemon-decisions", type=int, default=2000)
    parser.add_argument("--doc", type=Path, default=REPO / "docs/benchmarks/placement-latency.md")
    parser.add_argument(
        "--trace-dir",
        type=Path,
        default=REPO / ".." / "shared" / "traces" / "alibaba-gpu-v2023",
        help="the Alibaba trace, for the whole-replay timing (skipped when absent)",
    )
    args = parser.parse_args()
    nodes = len(synthetic_nodes(SCALE))
    rows = []
    for name in args.policies.split(","):
        cold, times, allocated = measure(name, args.decisions, args.warmup, args.seed)
        p50, p99 = np.percentile(times, [50, 99])
        rows.append(
            f"| {name} | {nodes} | {args.decisions} | {p50:.2f} | {p99:.2f} | "
            f"{times.max():.2f} | {np.max(cold, initial=0):.1f} | {allocated:.1f} |"
        )
    table = "\n".join(
        [
            "| policy | nodes | decisions | p50 ms | p99 ms | max ms | warm-up max ms "
            "| GPU allocated after, % |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    daemon = daemon_table(args.daemon_decisions, args.seed)
    print(daemon)
    replays = replay_rows(args.trace_dir)
    replay_table = "\n".join(
        ["| policy | pods | replay seconds | peak RSS MiB |", "|---|---|---|---|", *replays]
    )
    if replays:
        print(replay_table)
    command = "python bench/placement_latency.py " + " ".join(sys.argv[1:])
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    document = _document(command.strip(), table, replay_table if replays else "", daemon)
    args.doc.write_text(document)
    return 0


def _priority_note() -> str:
    niceness = os.nice(0)
    if niceness >= 0:
        return ""
    return (
        f" The run had scheduling priority nice {niceness}, to keep other jobs on the machine"
        " from preempting it inside the timed tail."
    )


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def _document(command: str, table: str, replay_table: str, daemon: str) -> str:
    replay_part = (
        f"""
## One whole replay (Alibaba trace, `default`, seed 42, about 10.8k pods on 1213 nodes)

Target: one `fgd` replay in 10 s or less on a 2-core machine, peak memory under 1 GiB. Each
replay runs in a fresh process (its peak RSS includes the interpreter, numpy and the trace).

{replay_table}
"""
        if replay_table
        else ""
    )
    return f"""# Placement latency: one decision on a 10,000-node cluster

Target: p99 <= 2 ms per decision in-process (the Kubernetes scheduler extender's budget is
5 ms over HTTP, docs/benchmarks/extender.md); the node daemon's placement of one job on an
8-GPU node: p99 <= 1 ms.

Command (from the repository root):

    {command}

Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()},
numpy {np.__version__}; {_load()} when the run ended (other work on the machine inflates
the tail).

{table}

How: the synthetic trace-shaped cluster (five GPU models, 1 to 8 GPUs per node) scaled to
10,008 nodes is filled to about {FILL_PCT} % of its GPU milli by the `random` policy; then each
policy places the same stream of synthetic pods from that same state. Only
`ClusterState.place` (feasibility over all nodes, scoring, GPU choice) is timed; each placement
is then allocated, so the cluster keeps filling. The fragment index (F_n per node) is built
before timing starts, as a long-running scheduler keeps it; after that every decision pays its
own incremental updates through allocate.

`fgd` and `gpupool` cache, per request shape (CPU, per-GPU milli, GPU count) and node, the
fragment the node would have after the placement; a placement changes one node, so a decision
recomputes only the nodes changed since that shape was last seen, plus O(nodes) vector work
(feasibility, gathering, the pick). The first decision for a shape never seen before computes
every feasible node: that is the "warm-up max" column, the slowest of the warm-up decisions
(1000 by default) that precede the measured ones and are left out of the percentiles; a running
scheduler pays it once per shape.{_priority_note()}

## The node daemon: one job on an 8-GPU node

{daemon}

The daemon's call, `scheduler.gpu_placement.place`: the node's eight GPUs (random free compute
and memory in tenths) made into the engine's one-row state, the registry's policy scoring against
the built-in prior target, and its GPU choice; each decision on a fresh node.
{replay_part}
## What the profile showed, and what was done

The engine was built vectorised from the start: F_n and the two (node, spec) counters behind it
are updated for the changed node only, and equal free milli on one node gives an equal outcome,
so only the lowest-index GPU of each distinct free value is a candidate (a node with eight free
GPUs is one candidate, not eight). That version replayed `fgd` on `default` (seed 42) in 2.7 s on
this machine. cProfile (`python -m cProfile -s tottime`) showed 70 % of the time in scoring: F
after the placement for every candidate GPU of every feasible node, as (candidates x specs)
array operations (5.2 of 7.7 profiled seconds). Answers per (request shape, node) are now cached
with a per-node version: a placement changes one node, so a repeated shape recomputes only the
nodes changed since it was last seen; scoring fell to 2.3 of 3.3 profiled seconds. What remains
is per-event overhead (allocate, the node refresh, feasibility over all nodes), each a handful
of small numpy calls. For the 10,000-node tail, what would close the gap is computing a new
shape's answers ahead of time for the target workload's shapes, and fewer specs per score (specs
that differ only in CPU share their GPU arithmetic).
"""


if __name__ == "__main__":
    raise SystemExit(main())
