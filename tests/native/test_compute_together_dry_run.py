"""bench/gpu/compute_together.py's priority case on the simulated driver: the GPU check is never
run blind, and `--only priority` runs that case alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.gpu_dry_run import dry_run

pytestmark = pytest.mark.serial  # wall-clock shares and latencies: run alone (Makefile)


def test_the_priority_case_runs_alone_on_the_simulated_driver(tmp_path: Path) -> None:
    args = ("--simulate", "--only", "priority", "--seconds", "1")
    # 1: a target missed
    report = dry_run("compute_together.py", tmp_path, *args, timeout=120, codes=(0, 1))
    rows = [line for line in report.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0] for row in rows] == [
        "| high request loop next to a busy low share: p99 latency",
        "| low share beside it: GPU time it gets of what high leaves",
    ]
    # the figures themselves are checked by tests/native/test_shim_arbiter.py with a loop that
    # holds on a loaded machine; here, that both were measured
    assert " ms alone (" in rows[0] and "% idle |" in rows[1], rows
