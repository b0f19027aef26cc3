"""The runner: policies x seeds, in order, deterministic, the same in parallel as inline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Request
from gpupool.sim import trace
from gpupool.sim.runner import RunResult, RunSpec, Scenario, plan, run_many

SYNTHETIC = Scenario(trace_dir=None, synthetic_scale=1)


def same_curves(left: list[RunResult], right: list[RunResult]) -> bool:
    return len(left) == len(right) and all(
        a.spec == b.spec
        and np.array_equal(a.curves.unalloc_pct, b.curves.unalloc_pct, equal_nan=True)
        for a, b in zip(left, right, strict=True)
    )


def test_plan_is_workload_major_in_the_order_given() -> None:
    assert plan(["w"], ["fgd", "random"], [2, 1]) == [
        RunSpec("w", "fgd", 2),
        RunSpec("w", "fgd", 1),
        RunSpec("w", "random", 2),
        RunSpec("w", "random", 1),
    ]


def test_runs_are_deterministic_and_seeds_matter() -> None:
    specs = plan(["synthetic"], ["fgd"], [1, 1, 2])
    first, again, other = run_many(SYNTHETIC, specs, jobs=1)
    assert np.array_equal(first.curves.unalloc_pct, again.curves.unalloc_pct, equal_nan=True)
    assert not np.array_equal(first.curves.unalloc_pct, other.curves.unalloc_pct, equal_nan=True)
    assert first.pods > 0 and 0 <= first.failed_pods < first.pods
    assert first.seconds >= first.replay_seconds > 0
    assert first.peak_rss_bytes > 10 * 2**20


def test_parallel_results_equal_inline_ones_in_the_same_order() -> None:
    specs = plan(["synthetic"], ["bestfit", "random"], [3, 4])
    seen: list[tuple[int, int]] = []
    parallel = run_many(
        SYNTHETIC, specs, jobs=2, progress=lambda done, total, _r: seen.append((done, total))
    )
    inline = run_many(SYNTHETIC, specs, jobs=1)
    assert [r.spec for r in parallel] == specs
    assert same_curves(parallel, inline)
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_unknown_policy_is_refused_before_any_run() -> None:
    with pytest.raises(InvalidRequest, match=r"unknown policy 'best'; valid policies: random, "):
        run_many(SYNTHETIC, plan(["synthetic"], ["fgd", "best"], [1]))


def test_unknown_synthetic_workload_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="unknown workload 'default'"):
        run_many(SYNTHETIC, plan(["default"], ["fgd"], [1]))


def test_negative_jobs_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="invalid job count -1"):
        run_many(SYNTHETIC, plan(["synthetic"], ["fgd"], [1]), jobs=-1)


def test_a_process_reads_the_trace_once(
    write_trace: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = "".join(f"n{i},96000,786432,8,G2\n" for i in range(4))
    pods = "".join(f"p{i},4000,15258,1,{100 * (i % 9 + 1)},,BE,Running,0,1,0\n" for i in range(40))
    scenario = Scenario(trace_dir=write_trace(nodes=nodes, pods=pods))
    calls: list[str] = []
    real_load = trace.load_workload

    def counting_load(trace_dir: Path, name: str) -> list[Request]:
        calls.append(name)
        return real_load(trace_dir, name)

    monkeypatch.setattr(trace, "load_workload", counting_load)
    results = run_many(scenario, plan(["default"], ["fgd", "random"], [1, 2]), jobs=1)
    assert [r.spec.seed for r in results] == [1, 2, 1, 2]
    assert calls == ["default"]


def _processes_with(marker: str, besides: int) -> list[int]:
    """Pids whose environment holds `marker` (spawned workers inherit the environment)."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == besides:
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ:
            found.append(int(entry))
    return found


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_workers_end_when_their_parent_is_killed() -> None:
    marker = f"GPUPOOL_RUNNER_TEST_{os.getpid()}_{time.monotonic_ns()}"
    code = (
        "from gpupool.sim.runner import Scenario, plan, run_many\n"
        "run_many(Scenario(None), plan(['synthetic'], ['fgd'], list(range(1000))), jobs=2)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, marker: "1"},
        stderr=subprocess.DEVNULL,
    )
    try:
        assert _wait_for(lambda: len(_processes_with(marker, parent.pid)) >= 2, 30), "no workers"
    finally:
        parent.kill()
        parent.wait()
    assert _wait_for(lambda: not _processes_with(marker, parent.pid), 10), "orphaned workers"
