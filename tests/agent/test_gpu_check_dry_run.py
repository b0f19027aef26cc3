"""bench/gpu/daemon.py's dry run on a simulated node: the GPU check is never run blind."""

from __future__ import annotations

from pathlib import Path

from tests.gpu_dry_run import dry_run


def test_the_daemon_gpu_check_passes_on_a_simulated_node(tmp_path: Path) -> None:
    args = ("--simulate", "1xA30", "--jobs", "2", "--hold", "3")
    report = dry_run("daemon.py", tmp_path, *args, timeout=120, short_tmp=True)
    rows = [line for line in report.splitlines() if line.startswith("| job-")]
    assert len(rows) == 2
    assert all(row.endswith("| yes |") and "OutOfMemoryError" in row for row in rows), rows
