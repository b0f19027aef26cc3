"""bench/gpu/inference_pool.py's dry run on a simulated node: the GPU check is never run blind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_inference_gpu_check_runs_on_a_simulated_node(tmp_path: Path) -> None:
    out = tmp_path / "dry.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONPATH"] = str(REPO / "src")
    env["TMPDIR"] = "/tmp"  # the daemon's socket path must stay short; the check cleans up
    done = subprocess.run(
        [
            *(sys.executable, str(REPO / "bench/gpu/inference_pool.py"), "--simulate"),
            *("--seconds", "1", "--out", str(out)),
        ],
        env=env,
        timeout=180,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text()
    assert "GPUs used pooled: [0] (one per service: 4)" in text
    rows = [line for line in text.splitlines() if line.startswith(("| bert-", "| gpt2-"))]
    assert len(rows) == 4 and all("'200'" in row and "'5" not in row for row in rows), rows
