"""Daemon fixtures: a fresh daemon per test on a simulated 2x A100-40GB node, or an agent alone."""

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

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.devices.factory import open_backend
from gpupool.devices.sim import mps_twin


def _kill_jobs(daemon: Daemon) -> None:
    """Leave nothing behind: the router process and every job's process group get SIGKILL, and
    every MPS control daemon the node started (they outlive the daemon on purpose, for its jobs)
    is told to quit."""
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        # the router outlives the daemon on purpose too (api/router_proc.py)
        os.kill(int((daemon.state_dir / "router.pid").read_text()), signal.SIGKILL)
    for pids in daemon.state_dir.glob("jobs/*/pids.json"):
        job = json.loads(pids.read_text())["job"]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job, signal.SIGKILL)
    for pipe in daemon.state_dir.glob("mps/*/pipe"):
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
        subprocess.run(
            mps_twin.command(), input="quit\n", text=True, env=env, timeout=30, check=False
        )


def serving(root: Path, spec: str, *extra: str) -> Iterator[Daemon]:
    """A fixture's daemon on a simulated node of `spec` under `root`, `gpupool serve EXTRA...`:
    started, yielded, then stopped with nothing of it left behind."""
    running = Daemon(root, spec, extra).start()
    yield running
    running.stop()
    _kill_jobs(running)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from serving(tmp_path, "2xA100-40GB")


@pytest.fixture
def reporting(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon on one A30 whose watchdog reports what it finds."""
    yield from serving(tmp_path, "1xA30", "--watchdog", "report")


@pytest.fixture
def killing(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon on one A30 whose watchdog kills the processes it finds."""
    yield from serving(tmp_path, "1xA30", "--watchdog", "kill")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    """An agent on a simulated 2x A100-40GB node, not started (no threads, no socket)."""
    (tmp_path / "state").mkdir()
    with open_backend("2xA100-40GB", tmp_path / "node") as backend:
        made = Agent(AgentConfig(tmp_path / "state"), backend)
        yield made
        made.stop()
