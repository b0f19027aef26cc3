"""The scheduling benchmark's verdicts: fidelity within 0.8 points, gpupool against fgd."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import numpy as np

from gpupool.sim.metrics import curves
from gpupool.sim.report import ComparisonRow
from gpupool.sim.runner import RunResult, RunSpec

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scheduling.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scheduling_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(policy: str, pct: int, ours: float, published: float) -> ComparisonRow:
    return ComparisonRow(policy, pct, ours, 0.1, 10, published, 0.1)


def test_fidelity_passes_within_0_8_points_at_100_and_130() -> None:
    bench = load_bench()
    rows = [
        row("fgd", 100, 4.9, 4.773),
        row("fgd", 130, 4.7, 4.609),
        row("packing", 100, 9.1, 8.221),  # 0.88 points off: fails
        row("packing", 130, 8.0, 7.998),
        row("gpupool", 100, 4.2, math.nan),
        row("gpupool", 130, 4.1, math.nan),
    ]
    lines, failed = bench.fidelity_table(rows)
    assert failed == ["packing"]
    assert lines[2].startswith("| fgd |") and lines[2].endswith("| pass |")
    assert lines[3].endswith("| FAIL |")
    assert lines[4].endswith("| not in the paper |")


def run(workload: str, policy: str, unalloc_at_100: float) -> RunResult:
    arrived = np.arange(0, 131_000, 500)
    allocated = np.minimum(arrived, 100_000 - unalloc_at_100 * 1000)
    return RunResult(
        RunSpec(workload, policy, 1),
        curves(arrived, allocated, arrived * 0, 100_000 - allocated, 100_000),
        pods=10,
        failed_pods=1,
        seconds=1.0,
        replay_seconds=1.0,
        peak_rss_bytes=1,
    )


def test_workloads_table_names_where_gpupool_is_worse() -> None:
    bench = load_bench()
    results = [
        run("default", "fgd", 4.8),
        run("default", "gpupool", 4.3),
        run("cpu050", "fgd", 5.0),
        run("cpu050", "gpupool", 5.2),
    ]
    lines, worse = bench.workloads_table(results)
    assert worse == ["cpu050"]
    assert lines[2].startswith("| default | 1 | 4.80 | 4.30 | -0.50 |")
    assert lines[2].endswith("| yes |")
    assert lines[3].endswith("| NO |")
