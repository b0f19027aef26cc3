"""kill -9 of the daemon loses nothing; one daemon per state dir; the uid rule; TCP tokens."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import Daemon, cli


def test_kill_9_loses_nothing_and_runs_nothing_twice(daemon: Daemon, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    script = f"echo run >> {marks}/$0; sleep $1; exit $2"
    # `b` runs until released, so it outlives the daemon however slowly the daemon restarts
    held = f"echo run >> {marks}/$0; until [ -e {marks}/release ]; do sleep 0.05; done"
    ends_while_down = daemon.submit(["sh", "-c", script, "a", "0.5", "4"], compute=30)
    outlives = daemon.submit(["sh", "-c", held, "b"], compute=30)
    queued = daemon.submit(["sh", "-c", script, "c", "0", "0"], gpus=2, compute=100)
    daemon.wait(outlives, ("running",))
    # running in the store is not yet launched: its own first line is (a daemon killed
    # before its supervisor began requeues it, rightly, and `b` would not be adopted)
    deadline = time.monotonic() + 30
    while not (marks / "b").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (marks / "b").exists(), daemon.job(outlives)
    daemon.kill()
    time.sleep(1.5)  # `a` ends while no daemon runs
    with pytest.raises(Exception, match="no gpupool daemon"):
        daemon.job(outlives)
    daemon.start()
    assert daemon.wait(ends_while_down)["exit_code"] == 4
    (marks / "release").write_text("")
    assert daemon.wait(outlives)["exit_code"] == 0
    assert daemon.wait(queued)["exit_code"] == 0
    kinds = [e["kind"] for e in daemon.job(outlives)["events"]]
    assert "adopted" in kinds
    for name in "abc":
        assert (marks / name).read_text() == "run\n"


def test_a_second_daemon_on_the_same_state_dir_refuses(daemon: Daemon) -> None:
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool",
            "serve",
            "--node-dir",
            str(daemon.node_dir),
            "--state-dir",
            str(daemon.state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 7
    assert second.stderr.strip().startswith("gpupool: error: another gpupool daemon (pid ")
    assert daemon.call("GET", "/v1/health")["ok"]


def test_a_state_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool",
            "serve",
            "--simulate",
            "1xA30",
            "--node-dir",
            str(tmp_path / "node"),
            "--state-dir",
            str(blocker / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("gpupool: error: cannot create the state dir") and (
        done.stderr.count("\n") == 1
    )


def test_a_state_dir_too_deep_for_a_unix_socket_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100) / "state"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool",
            "serve",
            "--simulate",
            "1xA30",
            "--node-dir",
            str(tmp_path / "node"),
            "--state-dir",
            str(deep),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "at most 107 bytes; use a shorter --state-dir" in done.stderr


def test_an_unknown_policy_or_lone_listen_is_one_line(tmp_path: Path) -> None:
    base = [
        sys.executable,
        "-m",
        "gpupool",
        "serve",
        "--simulate",
        "1xA30",
        "--node-dir",
        str(tmp_path / "node"),
        "--state-dir",
        str(tmp_path / "state"),
    ]
    for extra, words in (
        (["--policy", "best"], "unknown policy 'best'; valid policies: random, dotprod, "),
        (["--listen", "127.0.0.1:1"], "--listen needs --token-file"),
    ):
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert words in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "state").exists()


def _as_user(
    uid: int, socket_path: Path, calls: list[tuple[str, str, dict[str, Any] | None]]
) -> list[Any]:
    """Make `calls` over the Unix socket from a child process running as `uid`."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another user, the same socket
        try:
            os.close(read)
            os.setgid(uid)
            os.setuid(uid)
            answers = []
            transport = httpx.HTTPTransport(uds=str(socket_path))
            with httpx.Client(transport=transport, base_url="http://gpupool") as client:
                for method, path, body in calls:
                    response = client.request(method, path, json=body)
                    answers.append([response.status_code, response.json()])
            os.write(write, json.dumps(answers).encode())
        except BaseException as err:
            os.write(write, json.dumps([repr(err)]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return list(json.loads(data))


@contextmanager
def open_daemon_on(spec: str) -> Iterator[Daemon]:
    """A daemon on a simulated node of `spec` whose socket other users can reach: pytest's own
    temp dirs are private, so this one is made in /tmp itself and removed at the end; with no
    socket group the daemon keeps its state dir 0700, opened here as an admin would (the tests
    open the socket itself)."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-uid-", dir="/tmp"))
    root.chmod(0o755)
    # the state dir as a socket group lays it out (0750 root:GROUP), the group nobody's (65534)
    (root / "state").mkdir(mode=0o750)
    os.chown(root / "state", 0, 65534)
    running = Daemon(root, spec).start()
    running.state_dir.chmod(0o755)
    try:
        yield running
    finally:
        running.stop()
        _kill_jobs(running)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def open_daemon() -> Iterator[Daemon]:
    """An open daemon (`open_daemon_on`) on one simulated A100."""
    with open_daemon_on("1xA100-40GB") as running:
        yield running


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_only_the_owner_or_root_may_cancel(open_daemon: Daemon) -> None:
    daemon = open_daemon
    os.chmod(daemon.state_dir / "gpupool.sock", 0o666)
    mine = daemon.submit(["sleep", "30"], compute=10)
    body = {"argv": ["sh", "-c", "id -u; sleep 30"], "compute": 10, "workdir": "/tmp"}
    submitted, refused = _as_user(
        65534,
        daemon.state_dir / "gpupool.sock",
        [("POST", "/v1/jobs", body), ("POST", f"/v1/jobs/{mine}/cancel", {})],
    )
    assert submitted[0] == 201 and submitted[1]["job"]["uid"] == 65534
    assert refused[0] == 403 and refused[1]["error"] == "PermissionDenied"
    assert daemon.job(mine)["state"] == "running"
    theirs = submitted[1]["job"]["id"]
    daemon.wait(theirs, ("running",))
    deadline = time.monotonic() + 10
    while not daemon.call("GET", f"/v1/jobs/{theirs}/logs")["data"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert daemon.call("GET", f"/v1/jobs/{theirs}/logs")["data"] == "65534\n"  # ran as them
    assert (
        daemon.call("POST", f"/v1/jobs/{theirs}/cancel", json={})["job"]["id"] == theirs
    )  # root may
    assert daemon.wait(theirs)["state"] == "cancelled"


def test_tcp_needs_the_bearer_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    with socket_port() as port:
        pass
    daemon = Daemon(
        tmp_path, "1xA30", ("--listen", f"127.0.0.1:{port}", "--token-file", str(token))
    ).start()
    try:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/v1/jobs").status_code == 401
        bad = httpx.get(f"{base}/v1/jobs", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401
        good = httpx.get(f"{base}/v1/jobs", headers={"Authorization": "Bearer s3cret"})
        assert good.status_code == 200 and good.json() == {"jobs": []}
        refused = cli("ps", url=base)
        assert refused.returncode == 6 and "bearer token" in refused.stderr
        env_ok = subprocess.run(
            [sys.executable, "-m", "gpupool", "ps", "--json"],
            capture_output=True,
            text=True,
            env=dict(os.environ, GPUPOOL_URL=base, GPUPOOL_TOKEN="s3cret"),
            timeout=60,
        )
        assert env_ok.returncode == 0 and '"jobs": []' in env_ok.stdout
        assert (
            httpx.get(
                f"{base}/openapi.json", headers={"Authorization": "Bearer s3cret"}
            ).status_code
            == 200
        )
    finally:
        daemon.stop()


class socket_port:
    """A free TCP port on 127.0.0.1 (closed again before use)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *_: object) -> None:
        self.sock.close()
