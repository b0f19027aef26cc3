"""bench/gpu/watchdog.py's dry run on a simulated node: the GPU check is never run blind."""

from __future__ import annotations

from pathlib import Path

from tests.gpu_dry_run import dry_run


def test_the_watchdog_gpu_check_passes_on_a_simulated_node(tmp_path: Path) -> None:
    report = dry_run("watchdog.py", tmp_path, "--simulate", "1xA30")
    rows = [line for line in report.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 2
    assert all(row.endswith("| yes |") for row in rows), rows
    assert "3GiB in the driver, share and context reserve 2GiB" in rows[0]
    assert "belongs to no job, 1GiB" in rows[1]
