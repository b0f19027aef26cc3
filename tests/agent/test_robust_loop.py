"""The queue loop under failure: a job whose launch or bookkeeping raises fails alone with its
reason while the others run; a persistent failure is logged once with its traceback, then
rate-limited, and retried with backoff."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.agent.daemon_support import until

from gpupool.agent import launcher, logs
from gpupool.agent.agent import Agent, AgentConfig
from gpupool.agent.jobs import Job, JobSpec, State
from gpupool.devices.factory import open_backend


def submit(agent: Agent, name: str) -> int:
    return agent.submit(JobSpec(("true",), name=name, compute=100, workdir="/"), 0, "root").id


def states(agent: Agent) -> dict[str, tuple[State, str]]:
    """Each job's state and the detail of its last event, by name."""
    return {
        job.name: (job.state, agent.store.events(job.id)[-1]["detail"])
        for job in agent.store.jobs()
    }


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gpupool.agent" and r.levelno >= logging.ERROR]


def test_a_job_whose_launch_raises_fails_alone_with_its_reason(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = launcher.launch

    def launch(job: Job, *args: Any) -> None:
        if job.spec.name == "bad":
            raise RuntimeError("injected")
        real(job, *args)

    monkeypatch.setattr(launcher, "launch", launch)
    first, bad, last = submit(agent, "first"), submit(agent, "bad"), submit(agent, "last")
    agent.start()
    done = until(lambda: all(agent.store.job(i).state.finished for i in (first, bad, last)))
    assert done
    seen = states(agent)
    assert seen["bad"] == (State.FAILED, "launch failed: RuntimeError: injected")
    assert seen["first"][0] is State.SUCCEEDED and seen["last"][0] is State.SUCCEEDED
    told = errors(caplog)
    # the job is the line's context, its prefix in the daemon's plain format (agent/logs.py)
    assert [(r.getMessage(), getattr(r, "job", None)) for r in told] == [("launch failed", bad)]
    assert told[0].exc_info is not None  # with its traceback


def test_a_job_whose_end_cannot_be_recorded_fails_alone(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = agent._finish

    def finish(job: Job, *args: Any) -> None:
        if job.spec.name == "bad":
            raise OSError("injected: cannot read its exit file")
        real(job, *args)

    monkeypatch.setattr(agent, "_finish", finish)
    ids = [submit(agent, name) for name in ("first", "bad", "last")]
    agent.start()
    assert until(lambda: all(agent.store.job(i).state.finished for i in ids))
    seen = states(agent)
    assert seen["bad"] == (
        State.FAILED,
        "bookkeeping failed: OSError: injected: cannot read its exit file",
    )
    assert seen["first"][0] is State.SUCCEEDED and seen["last"][0] is State.SUCCEEDED
    told = [(r.getMessage(), getattr(r, "job", None)) for r in errors(caplog)]
    assert told == [("bookkeeping failed", ids[1])]


@pytest.mark.parametrize("part, method", [("agent", "schedule"), ("sampler", "sample")])
def test_a_persistent_failure_is_told_once_then_rate_limited_with_backoff(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    part: str,
    method: str,
) -> None:
    calls: list[float] = []

    def broken() -> None:
        calls.append(time.monotonic())
        raise RuntimeError("stuck")

    monkeypatch.setattr(logs, "REPEAT_EVERY_S", 1.0)
    monkeypatch.setattr(logs, "MAX_BACKOFF_S", 0.8)
    (tmp_path / "state").mkdir()
    with open_backend("2xA100-40GB", tmp_path / "node") as backend:
        # the loop and the sampler at the same pace: a try every 0.1 s without backoff
        agent = Agent(AgentConfig(tmp_path / "state", tick_s=0.1, sample_s=0.1), backend)
        monkeypatch.setattr(agent if part == "agent" else agent.sampler, method, broken)
        agent.start()
        try:
            assert until(lambda: calls and time.monotonic() - calls[0] > 3.0, timeout=15)
        finally:
            agent.stop()
    # backoff: 0.2, 0.4, 0.8, 0.8, ... s apart, so 5 or 6 tries in 3 s rather than 30
    tries = [at for at in calls if at - calls[0] <= 3.0]
    assert 3 <= len(tries) <= 8, len(tries)
    told = errors(caplog)
    assert told[0].exc_info is not None  # the first time, with its traceback
    assert told[0].getMessage().endswith("failed: RuntimeError: stuck")
    again = told[1:]
    assert 1 <= len(again) <= 4  # at most once a REPEAT_EVERY_S
    assert all(r.exc_info is None and "still failing (" in r.getMessage() for r in again)


def test_serve_logs_with_its_prefix_to_stderr() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from gpupool.agent import logs; logs.configure(); logs.log.error('a line')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stderr == "gpupool serve: ERROR: a line\n"
