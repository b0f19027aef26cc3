"""bench/gpu/modes.py's dry run on a simulated node: the MPS GPU check is never run blind.

Both of its tables: the 30 % + 70 % pair, and the high request loop beside a low job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_mps_gpu_check_passes_on_a_simulated_node(tmp_path: Path) -> None:
    out = tmp_path / "dry.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONPATH"] = str(REPO / "src")
    env["TMPDIR"] = "/tmp"  # the daemon's socket path must stay short; the check cleans up
    done = subprocess.run(
        [
            *(sys.executable, str(REPO / "bench/gpu/modes.py")),
            *("--simulate", "1xA30", "--seconds", "1", "--memory-gib", "2", "--out", str(out)),
        ],
        env=env,
        timeout=180,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    pair = [row for row in rows if row.startswith(("| 30 %", "| 70 %"))]
    assert len(pair) == 2
    assert all("| yes | OutOfMemoryError |" in row for row in pair), rows
    # the priority pair on the twin: the high request loop keeps its latency beside the low job,
    # and loses it beside the same job at high priority
    steps = {row.split(" | ")[0][2:]: row.split(" | ")[1:] for row in rows}
    # (by the request rate: a 1 s run's p50 moves with the machine's load, the rate much less;
    # beside the low job it is about what it is alone, beside a high one a fiftieth of it)
    alone_rate = float(steps["high alone"][0])
    assert float(steps["high beside low"][0]) > 0.6 * alone_rate, rows
    no_priorities = steps["high beside the same job at high (no priorities)"]
    assert float(no_priorities[0]) < 0.3 * alone_rate, rows
