"""A GPU check of bench/gpu/ in its dry run on the simulated driver, for the tests that make sure
no GPU check is ever run blind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
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
    in a folder of its own under /tmp, for a check that starts a daemon (its socket path must
    stay short); no process that knows that folder may outlive the check."""
    out = out_dir / "dry.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONPATH"] = str(REPO / "src")
    tmp = tempfile.mkdtemp(prefix="gpd", dir="/tmp") if short_tmp else None
    if tmp is not None:
        env["TMPDIR"] = tmp
    try:
        done = subprocess.run(
            [sys.executable, str(REPO / "bench" / "gpu" / script), *args, "--out", str(out)],
            env=env,
            timeout=timeout,
            capture_output=True,
            text=True,
        )
        assert done.returncode in codes, done.stdout + done.stderr
        if tmp is not None:
            left = _outliving(tmp)
            assert not left, f"left running: {left}"
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out.read_text()


def _outliving(tmp: str, grace_s: float = 10.0) -> list[str]:
    """The command lines of the processes whose environment names `tmp`, once those that were
    killed have had `grace_s` to go."""
    marker = tmp.encode()
    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if marker in (proc / "environ").read_bytes():
                    left.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:  # gone, or not ours to read
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
