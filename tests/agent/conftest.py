"""Daemon fixtures: a fresh daemon per test on a simulated 2x A100-40GB node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.daemon_support import Daemon

from gpupool.devices.sim import mps_twin


def _kill_jobs(daemon: Daemon) -> None:
    """Leave nothing behind: every job's process group gets SIGKILL, and every MPS control
    daemon the node started (they outlive the daemon on purpose, for its jobs) is told to quit."""
    for pids in daemon.state_dir.glob("jobs/*/pids.json"):
        job = json.loads(pids.read_text())["job"]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job, signal.SIGKILL)
    for pipe in daemon.state_dir.glob("mps/*/pipe"):
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
        subprocess.run(
            mps_twin.command(), input="quit\n", text=True, env=env, timeout=30, check=False
        )


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = Daemon(tmp_path, "2xA100-40GB").start()
    yield running
    running.stop()
    _kill_jobs(running)
