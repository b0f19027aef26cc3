"""Run many (workload, policy, seed) replays in parallel processes, in a deterministic order."""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import NodeSpec, Request
from gpupool.scheduler import TargetWorkload, check_policy
from gpupool.sim import procedure, synthetic, trace
from gpupool.sim.metrics import Curves, curves
from gpupool.sim.replay import replay


@dataclass(frozen=True)
class Scenario:
    """Where nodes and pods come from: a trace directory, or the synthetic cluster when None."""

    trace_dir: Path | None = None
    synthetic_scale: int = synthetic.DEFAULT_SCALE
    #: keep the fragment curve (the scheduling benchmark's tables do not use it)
    fragment_curves: bool = True

    def describe(self) -> str:
        """One line for people: which cluster this is, with its size."""
        if self.trace_dir is None:
            nodes = synthetic.synthetic_nodes(self.synthetic_scale)
            name = "synthetic cluster"
        else:
            nodes = trace.load_nodes(self.trace_dir)
            name = "Alibaba GPU trace"
        gpus = sum(node.gpu_count for node in nodes)
        return f"{name} ({len(nodes)} nodes, {gpus} GPUs)"

    def workload_names(self) -> list[str]:
        """The workloads this scenario can replay."""
        if self.trace_dir is None:
            return [synthetic.SYNTHETIC_WORKLOAD]
        return trace.workload_names(self.trace_dir)

    def check_workload(self, name: str) -> None:
        """Raise InvalidRequest (listing the available names) for an unknown workload."""
        if self.trace_dir is not None:
            trace.workload_path(self.trace_dir, name)
        elif name != synthetic.SYNTHETIC_WORKLOAD:
            raise InvalidRequest(
                f"unknown workload {name!r}; the synthetic cluster has only "
                f"{synthetic.SYNTHETIC_WORKLOAD!r}"
            )

    def never_placed(self, workload: str) -> list[str]:
        """Warnings for the workload's pods that no node can ever hold (none when synthetic)."""
        if self.trace_dir is None:
            return []
        nodes, pods = self.load(workload)
        source = trace.workload_path(self.trace_dir, workload).name
        return trace.never_placed(nodes, pods, source)

    def load(self, workload: str) -> tuple[list[NodeSpec], list[Request]]:
        """Nodes and the workload's pods, in file order."""
        self.check_workload(workload)
        if self.trace_dir is None:
            scale = self.synthetic_scale
            return synthetic.synthetic_nodes(scale), synthetic.synthetic_workload(scale)
        return trace.load_nodes(self.trace_dir), trace.load_workload(self.trace_dir, workload)


@dataclass(frozen=True)
class RunSpec:
    """One replay: the paper's unit of measurement."""

    workload: str
    policy: str
    seed: int


@dataclass(frozen=True)
class RunResult:
    """What one replay measured."""

    spec: RunSpec
    curves: Curves
    pods: int
    failed_pods: int
    #: wall time of the run in its process: arrival procedure, replay and metrics
    seconds: float
    #: time the replay engine reported for placing the pods
    replay_seconds: float
    #: peak resident memory of the process that ran it (ru_maxrss), bytes
    peak_rss_bytes: int


#: CPU time of one replay relative to `random`'s (measured on `default`, seed 42); policies
#: not named cost 1
_RELATIVE_COST = {
    "gpupool": 5.0,
    "fgd": 3.8,
    "packing": 1.8,
    "bestfit": 1.8,
    "clustering": 1.7,
    "dotprod": 1.5,
}

Progress = Callable[[int, int, RunResult], None]


@dataclass(frozen=True)
class _Loaded:
    nodes: list[NodeSpec]
    pods: list[Request]
    #: FGD's target workload, derived from the original pods (before shuffle and inflation)
    target: TargetWorkload
    cluster_milli: int


# Per process: each worker reads a workload's files once, however many runs it does.
_LOADED: dict[tuple[Scenario, str], _Loaded] = {}


def _loaded(scenario: Scenario, workload: str) -> _Loaded:
    key = (scenario, workload)
    if key not in _LOADED:
        nodes, pods = scenario.load(workload)
        _LOADED[key] = _Loaded(
            nodes, pods, TargetWorkload.from_requests(pods), trace.cluster_gpu_milli(nodes)
        )
    return _LOADED[key]


def run_one(scenario: Scenario, spec: RunSpec) -> RunResult:
    """Replay one (workload, policy, seed) in this process."""
    return run_group(scenario, [spec])[0]


def run_group(scenario: Scenario, specs: Sequence[RunSpec]) -> list[RunResult]:
    """Replay several policies on one workload and seed in this process: the pods' arrival
    order is made once for all of them (each run's time includes it)."""
    if len({(spec.workload, spec.seed) for spec in specs}) > 1:
        raise InvalidRequest("a group of runs must share one workload and one seed")
    if not specs:
        return []
    # Reading the files happens once per process, so it is not part of a run's time.
    loaded = _loaded(scenario, specs[0].workload)
    start = time.perf_counter()
    arriving = procedure.arrival_order(loaded.pods, loaded.cluster_milli, specs[0].seed)
    arrival_seconds = time.perf_counter() - start
    return [_run_arrived(scenario, loaded, spec, arriving, arrival_seconds) for spec in specs]


def _run_arrived(
    scenario: Scenario,
    loaded: _Loaded,
    spec: RunSpec,
    arriving: list[Request],
    arrival_seconds: float,
) -> RunResult:
    start = time.perf_counter() - arrival_seconds
    result = replay(
        loaded.nodes,
        arriving,
        spec.policy,
        spec.seed,
        loaded.target,
        fragment_curve=scenario.fragment_curves,
    )
    run_curves = curves(
        result.arrived_milli,
        result.allocated_milli,
        result.fragment_milli,
        result.idle_milli,
        loaded.cluster_milli,
    )
    return RunResult(
        spec=spec,
        curves=run_curves,
        pods=len(arriving),
        failed_pods=int(np.count_nonzero(~np.asarray(result.placed, dtype=bool))),
        seconds=time.perf_counter() - start,
        replay_seconds=float(result.seconds),
        # Linux reports ru_maxrss in KiB.
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )


def check_policies(policies: Sequence[str]) -> None:
    """Raise InvalidRequest, listing the valid names, for an unknown policy."""
    for name in policies:
        check_policy(name)


def plan(workloads: Sequence[str], policies: Sequence[str], seeds: Sequence[int]) -> list[RunSpec]:
    """Every combination, workload-major, in the order given: the order results come back in."""
    return [RunSpec(w, p, s) for w in workloads for p in policies for s in seeds]


def run_many(
    scenario: Scenario,
    specs: Sequence[RunSpec],
    *,
    jobs: int = 0,
    progress: Progress | None = None,
) -> list[RunResult]:
    """Run `specs` in min(cpu_count, jobs) processes (0 = every core); results in `specs` order.

    With one worker the runs happen in this process, which keeps profiles and tracebacks simple.
    """
    if not specs:
        return []
    check_policies(sorted({spec.policy for spec in specs}))
    for workload in sorted({spec.workload for spec in specs}):
        scenario.check_workload(workload)
    if jobs < 0:
        raise InvalidRequest(f"invalid job count {jobs}: must be 0 (every core) or more")
    cores = os.cpu_count() or 1
    workers = min(cores if jobs == 0 else min(jobs, cores), len(specs))
    if workers <= 1:
        return _run_inline(scenario, specs, progress)
    return _run_pool(scenario, specs, workers, progress)


def _run_inline(
    scenario: Scenario, specs: Sequence[RunSpec], progress: Progress | None
) -> list[RunResult]:
    results: list[RunResult] = []
    for spec in specs:
        results.append(run_one(scenario, spec))
        if progress is not None:
            progress(len(results), len(specs), results[-1])
    return results


def _init_worker(parent: int) -> None:
    """Ctrl-C is the parent's to handle (a worker would print a traceback of its own); and a
    worker ends when its parent is gone, killed say, rather than replay on for nobody."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch_parent, name="gpupool-parent-watch", daemon=True).start()


def _run_pool(
    scenario: Scenario, specs: Sequence[RunSpec], workers: int, progress: Progress | None
) -> list[RunResult]:
    # spawn, not fork: the caller may run a progress-display thread, and forking a threaded
    # process can leave a lock held forever in the child.
    context = multiprocessing.get_context("spawn")
    results: list[RunResult | None] = [None] * len(specs)
    pool = ProcessPoolExecutor(workers, context, initializer=_init_worker, initargs=(os.getpid(),))
    # The runs of one workload and seed go to one worker together (their arrival order is
    # made once); the costliest groups first, so that the last ones to finish are short and
    # no core idles while the other finishes a long one.
    groups: dict[tuple[str, int], list[int]] = {}
    for index, spec in enumerate(specs):
        groups.setdefault((spec.workload, spec.seed), []).append(index)
    order = sorted(
        groups.values(),
        key=lambda members: -sum(_RELATIVE_COST.get(specs[i].policy, 1.0) for i in members),
    )
    done = 0
    with pool:
        futures: dict[Future[list[RunResult]], list[int]] = {
            pool.submit(run_group, scenario, [specs[i] for i in members]): members
            for members in order
        }
        try:
            for future in as_completed(futures):
                for index, result in zip(futures[future], future.result(), strict=True):
                    results[index] = result
                    done += 1
                    if progress is not None:
                        progress(done, len(specs), result)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [result for result in results if result is not None]
