"""bench/gpu/watchdog.py's dry run on a simulated node: the GPU check is never run blind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_watchdog_gpu_check_passes_on_a_simulated_node(tmp_path: Path) -> None:
    out = tmp_path / "dry.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONPATH"] = str(REPO / "src")
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench/gpu/watchdog.py"),
            "--simulate",
            "1xA30",
            "--out",
            str(out),
        ],
        env=env,
        timeout=180,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 2
    assert all(row.endswith("| yes |") for row in rows), rows
    assert "3GiB in the driver, share and context reserve 2GiB" in rows[0]
    assert "belongs to no job, 1GiB" in rows[1]
