"""`gpupool exec` end to end: CLI launch spec, interception library, simulated driver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from shim_support import PROGS, compile_prog

from gpupool.core.units import GiB


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progs") / "shim_client"
    return compile_prog(PROGS / "shim_client.c", out)


def gpupool_exec(node: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "LD_"))}
    env["GPUPOOL_SIM_NODE"] = str(node)  # where `--simulate` puts its node
    return subprocess.run(
        [sys.executable, "-m", "gpupool", "exec", "--simulate", "1xH100", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_share_from_the_command_line_holds(client: Path, tmp_path: Path) -> None:
    node = tmp_path / "node"
    steps = ["alloc", str(GiB), "alloc", "1", "meminfo", "run", "1", "kernel"]
    free = gpupool_exec(node, "--", str(client), "run", "1", "kernel")
    shared = gpupool_exec(node, "--memory", "1GiB", "--compute", "50", "--", str(client), *steps)
    assert (free.returncode, shared.returncode) == (0, 0), shared.stderr
    lines = [line.split() for line in shared.stdout.splitlines()]
    assert lines[:3] == [["alloc", "0"], ["alloc", "2"], ["meminfo", "0", str(GiB)]]

    def rate(fields: list[str]) -> float:
        return int(fields[1]) / int(fields[2])

    ratio = rate(lines[3]) / rate(free.stdout.split())
    assert abs(ratio - 0.5) <= 0.05, f"--compute 50 gave {ratio:.3f}"
    assert "out of memory on device 0: 1 GiB used + 1 B asked > limit 1 GiB" in shared.stderr
