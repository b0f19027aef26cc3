"""The daemon's log: its lines about a job carry the job, as a prefix in the plain format and as
fields of their own in `--log-format json`; a bad format is one line and exit 2."""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.agent.conftest import serving
from tests.agent.daemon_support import Daemon, until

from gpupool.agent.logs import JsonLines

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def json_daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from serving(tmp_path, "1xA100-40GB", "--log-format", "json")


def _lines(daemon: Daemon) -> list[str]:
    daemon.stop()  # its last line written too
    return (daemon.root / "serve.log").read_text().splitlines()


def test_json_lines_carry_the_job_they_are_about(json_daemon: Daemon) -> None:
    job = json_daemon.submit(["sh", "-c", "exit 3"])
    assert json_daemon.wait(job)["state"] == "failed"
    entries = [json.loads(line) for line in _lines(json_daemon)]  # every line is JSON
    assert all(RFC3339_UTC.match(e["time"]) and e["logger"].startswith("gpupool") for e in entries)
    about = [e for e in entries if e.get("job") == job]
    assert about == [
        {
            "time": about[0]["time"],
            "level": "info",
            "logger": "gpupool.agent",
            "message": "failed: exit code 3",
            "job": job,
            "uid": os.getuid(),
        }
    ]
    assert entries[-1]["message"].startswith("stopped; running jobs go on")
    assert "job" not in entries[-1]


def test_the_plain_log_shows_the_job_as_a_prefix(daemon: Daemon) -> None:
    job = daemon.submit(["true"])
    assert daemon.wait(job)["state"] == "succeeded"
    lines = _lines(daemon)
    assert f"gpupool serve: job {job}: succeeded: exit code 0" in lines
    assert (
        lines[-1] == "gpupool serve: stopped; running jobs go on and are adopted at the next start"
    )


def test_a_traceback_is_one_string_field_of_one_line() -> None:
    try:
        raise RuntimeError("injected")
    except RuntimeError:
        record = logging.LogRecord("gpupool.agent", logging.ERROR, "", 0, "launch failed", (), None)
        record.exc_info = sys.exc_info()
    record.job = 7
    line = JsonLines().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "error" and entry["job"] == 7 and entry["message"] == "launch failed"
    assert (
        entry["exception"].startswith("Traceback")
        and "RuntimeError: injected" in entry["exception"]
    )


@pytest.mark.parametrize("how", ["option", "variable"])
def test_a_bad_log_format_is_one_line_and_exit_2(tmp_path: Path, how: str) -> None:
    state = tmp_path / "state"
    args = ["--log-format", "xml"] if how == "option" else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if how == "variable":
        env["GPUPOOL_LOG_FORMAT"] = "xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool",
            "serve",
            "--simulate",
            "1xA30",
            "--state-dir",
            str(state),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "gpupool: error: invalid --log-format 'xml': use plain or json\n"
    assert not state.exists()  # nothing was made


def _entries(daemon: Daemon) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (daemon.root / "serve.log").read_text().splitlines()]


def test_a_service_and_its_replicas_lines_carry_the_service(json_daemon: Daemon) -> None:
    body = {"name": "web", "argv": ["sleep", "60"], "workdir": "/tmp", "memory": "2Gi"}
    json_daemon.call("POST", "/v1/services", json={**body, "compute": 20})
    created = until(lambda: [e for e in _entries(json_daemon) if e.get("service") == "web"])
    assert created[0]["message"] == f"created by {pwd.getpwuid(os.getuid()).pw_name}"
    assert created[0]["uid"] == os.getuid() and "job" not in created[0]
    started = until(lambda: [e for e in _entries(json_daemon) if "started on port" in e["message"]])
    job = int(re.findall(r"\(job (\d+)\)", started[0]["message"])[0])
    json_daemon.call("DELETE", "/v1/services/web", json={})
    ended = until(lambda: [e for e in _entries(json_daemon) if e.get("job") == job])
    assert ended[0]["service"] == "web" and ended[0]["uid"] == os.getuid()
