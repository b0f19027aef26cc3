"""Daemon fixtures: a fresh daemon per test on a simulated 2x A100-40GB node."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.daemon_support import Daemon


def _kill_jobs(daemon: Daemon) -> None:
    """Leave no job behind: every job's process group gets SIGKILL."""
    for pids in daemon.state_dir.glob("jobs/*/pids.json"):
        import json

        job = json.loads(pids.read_text())["job"]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job, signal.SIGKILL)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = Daemon(tmp_path, "2xA100-40GB").start()
    yield running
    running.stop()
    _kill_jobs(running)
