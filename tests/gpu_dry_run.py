"""A GPU check of bench/gpu/ in its dry run on the simulated driver, for the tests that make sure
no GPU check is ever run blind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def dry_run(
    script: str,
    out_dir: Path,
    *args: str,
    timeout: float = 180,
    short_tmp: bool = False,
    codes: tuple[int, ...] = (0,),
) -> str:
    """The report of `bench/gpu/SCRIPT ARGS... --out FILE`, run as from a checkout (none of the
    test's GPUPOOL_* settings) and ended with one of `codes`. `short_tmp`: its temporary files
    under /tmp, for a check that starts a daemon (its socket path must stay short; the check
    cleans up)."""
    out = out_dir / "dry.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONPATH"] = str(REPO / "src")
    if short_tmp:
        env["TMPDIR"] = "/tmp"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu" / script), *args, "--out", str(out)],
        env=env,
        timeout=timeout,
        capture_output=True,
        text=True,
    )
    assert done.returncode in codes, done.stdout + done.stderr
    return out.read_text()
