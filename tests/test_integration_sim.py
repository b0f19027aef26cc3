"""End to end on one simulated node: `gpupool exec` runs a CUDA program, `gpupool gpus` sees it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.core.units import GiB, MiB
from gpupool.isolation.libraries import native_libraries

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD_SOURCE = ROOT / "tests" / "native" / "progs" / "sim_workload.c"
CUDA_ERROR_OUT_OF_MEMORY = 2


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workload, linked with the simulated driver as libcuda.so.1 (both libraries built)."""
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    exe = tmp_path_factory.mktemp("workload") / "sim_workload"
    subprocess.run(
        [
            *("gcc", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'native' / 'include'}"),
            *("-o", str(exe), str(WORKLOAD_SOURCE)),
            *(f"-L{native_libraries().sim_dir}", "-l:libcuda.so.1"),
        ],
        check=True,
    )
    return exe


@pytest.fixture
def env() -> dict[str, str]:
    scrub = ("GPUPOOL_", "CUDA_", "LD_PRELOAD", "LD_LIBRARY_PATH")
    return {k: v for k, v in os.environ.items() if not k.startswith(scrub)}


def gpus_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "gpupool", "gpus", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture
def launcher(
    workload: Path, env: dict[str, str], tmp_path: Path
) -> Iterator[subprocess.Popen[str]]:
    """`gpupool exec` of the workload under a 4 GiB share, on a fresh node in tmp_path/node."""
    past_the_share = 3 * GiB + MiB  # with the 1 GiB it holds: past 4 GiB
    share = ["--simulate", "1xH100-80GB", "--node-dir", str(tmp_path / "node"), "--memory", "4GiB"]
    process = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "exec", *share, "--", str(workload), str(past_the_share)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield process
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=30)


def test_gpus_sees_what_exec_runs_on_the_same_node(
    launcher: subprocess.Popen[str], env: dict[str, str], tmp_path: Path
) -> None:
    node = tmp_path / "node"
    assert launcher.stdout is not None
    alloc, ready = launcher.stdout.readline(), launcher.stdout.readline()
    assert alloc.split()[-1] == f"rc={CUDA_ERROR_OUT_OF_MEMORY}", alloc + ready
    assert ready.startswith("ready pid="), alloc + ready
    pid = int(ready.split("=")[1])
    try:
        running = gpus_json(env, "--node-dir", str(node))
        assert running["simulated"] and running["node_dir"] == str(node)
        (gpu,) = running["gpus"]
        (process,) = gpu["processes"]
        assert (process["pid"], process["memory_used"]) == (pid, GiB)
        assert process["gpu_utilization"] > 0 and gpu["utilization"] > 0
        assert gpu["memory_used"] == GiB

        launcher.send_signal(signal.SIGUSR1)  # passed on by `gpupool exec`: stop launching
        assert launcher.stdout.readline() == "sleeping\n"
    finally:
        os.kill(pid, signal.SIGKILL)
    assert launcher.wait(timeout=30) == 128 + signal.SIGKILL
    # the same node again, this time named by its spec as well
    after = gpus_json(env, "--simulate", "1xH100-80GB", "--node-dir", str(node))
    (gpu,) = after["gpus"]
    assert gpu["processes"] == [] and gpu["memory_used"] == 0
