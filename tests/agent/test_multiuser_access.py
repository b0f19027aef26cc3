"""Many users, one pool: who may connect, who sees what, who may act, with real Unix users.

A root daemon on a simulated node with a socket group both users are in, and an admin group
neither is in at first; each user runs the CLI or talks HTTP over the real socket as themselves.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.agent.daemon_support import CUDA_JOB, Daemon, until
from tests.agent.multiuser_support import group_daemon
from tests.agent.watchdog_support import SHARE, escape_command, wait_for_job_event
from tests.users import (
    User,
    add_to_group,
    check_interpreter,
    create_group,
    gpupool_as,
    remove_group,
    remove_tree,
    run_as,
    users,
    world_dir,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: needs root")

NOBODY = User("nobody", 65534, 65534)
_HTTP = """
import json, sys, httpx
sock, method, path, body, headers = json.loads(sys.argv[1])
with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://gpupool") as client:
    extra = {} if body is None else {"json": body}
    answer = client.request(method, path, headers=headers, **extra)
try:
    data = answer.json()
except ValueError:
    data = answer.text
print(json.dumps([answer.status_code, data]))
"""


def http_as(
    user: User,
    sock: Path,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One request over the Unix socket from a process of `user`: (status, JSON body)."""
    done = run_as(
        user, [sys.executable, "-c", _HTTP, json.dumps([str(sock), method, path, body, headers])]
    )
    assert done.returncode == 0, done.stderr
    status, data = json.loads(done.stdout)
    return int(status), data


@dataclass
class Pool:
    daemon: Daemon
    alice: User
    bob: User
    admins: str

    @property
    def sock(self) -> Path:
        return self.daemon.state_dir / "gpupool.sock"

    def submit_as(self, user: User, argv: list[str], **share: Any) -> int:
        body = {"argv": argv, "workdir": "/tmp", "compute": 10, **share}
        status, data = http_as(user, self.sock, "POST", "/v1/jobs", body)
        assert status == 201, data
        return int(data["job"]["id"])


@pytest.fixture
def pool() -> Iterator[Pool]:
    admins = create_group()
    try:
        with group_daemon("1xA100-40GB", extra=("--admin-group", admins)) as (daemon, made):
            alice, bob = made
            yield Pool(daemon, alice, bob, admins)
    finally:
        remove_group(admins)


def test_the_socket_is_the_groups_and_nobody_elses(pool: Pool) -> None:
    members = os.stat(pool.sock).st_gid
    for path, mode in ((pool.sock, 0o660), (pool.daemon.state_dir, 0o750)):
        found = os.lstat(path)
        assert (stat.S_IMODE(found.st_mode), found.st_uid, found.st_gid) == (mode, 0, members)
    assert http_as(pool.alice, pool.sock, "GET", "/v1/health")[0] == 200
    outsider = run_as(
        NOBODY, [sys.executable, "-m", "gpupool", "ps"], env={"GPUPOOL_URL": pool.daemon.url}
    )
    assert outsider.returncode == 6 and outsider.stderr.count("\n") == 1
    # this pool's group is not gpupool: the line names no group the outsider could not know
    assert "permission denied (only the daemon's user and its socket group" in outsider.stderr


def test_others_see_a_jobs_share_but_not_its_command_logs_or_events(pool: Pool) -> None:
    daemon, alice, bob = pool.daemon, pool.alice, pool.bob
    job = pool.submit_as(
        alice, ["sh", "-c", "echo alice-secret; sleep 60"], env={"TOKEN": "alice-env"}
    )
    daemon.wait(job, ("running",))
    status, listed = http_as(bob, pool.sock, "GET", "/v1/jobs")
    assert status == 200
    [theirs] = listed["jobs"]
    assert theirs["id"] == job and theirs["user"] == alice.name and theirs["command"] is None
    assert theirs["compute"] == 10 and theirs["state"] == "running"  # the share stays public
    for path in (f"/v1/jobs/{job}", f"/v1/jobs/{job}/logs", f"/jobs/{job}"):
        status, refused = http_as(bob, pool.sock, "GET", path)
        assert status == 403 and refused["error"] == "PermissionDenied", path
        assert refused["message"].startswith(
            f"job {job} belongs to {alice.name}: only they or an admin may "
        )
    status, board = http_as(bob, pool.sock, "GET", "/v1/dashboard")
    assert status == 200 and [row["id"] for row in board["jobs"]] == [job]
    assert all(event["job_id"] != job for event in board["events"])
    assert "alice-secret" not in json.dumps(board) and "sleep" not in json.dumps(board)
    # bob's CLI: ps shows the job, describe says why not in one line (exit 6, PermissionDenied)
    ps = gpupool_as(bob, "ps", "--json", url=daemon.url)
    assert ps.returncode == 0 and json.loads(ps.stdout)["jobs"][0]["command"] is None
    describe = gpupool_as(bob, "describe", str(job), url=daemon.url)
    assert describe.returncode == 6 and describe.stderr.count("\n") == 1
    assert "belongs to" in describe.stderr
    # the owner and root see it all
    status, own = http_as(alice, pool.sock, "GET", f"/v1/jobs/{job}")
    assert status == 200 and own["command"][-1] == "echo alice-secret; sleep 60"
    assert any(event["kind"] == "started" for event in own["events"])
    assert "alice-secret" in gpupool_as(alice, "logs", str(job), url=daemon.url).stdout
    shown = gpupool_as(alice, "describe", str(job), url=daemon.url)
    assert shown.returncode == 0 and "echo alice-secret" in shown.stdout
    assert daemon.job(job)["command"][-1] == "echo alice-secret; sleep 60"
    assert any(e["job_id"] == job for e in daemon.call("GET", "/v1/dashboard")["events"])


def test_drain_and_others_jobs_are_for_admins(pool: Pool) -> None:
    daemon, alice, bob = pool.daemon, pool.alice, pool.bob
    job = pool.submit_as(alice, ["sleep", "60"])
    daemon.wait(job, ("running",))
    status, refused = http_as(bob, pool.sock, "POST", f"/v1/jobs/{job}/cancel", {})
    assert status == 403 and refused["message"] == (
        f"job {job} belongs to {alice.name}: only they or an admin may cancel it"
    )
    for on in (True, False):
        status, refused = http_as(bob, pool.sock, "POST", "/v1/drain", {"on": on})
        assert status == 403 and refused["error"] == "PermissionDenied"
        assert f"{bob.name} is not one" in refused["message"]
    drained = gpupool_as(bob, "drain", url=daemon.url)
    assert drained.returncode == 6 and drained.stderr.count("\n") == 1
    assert daemon.job(job)["state"] == "running" and not daemon.call("GET", "/v1/node")["draining"]
    add_to_group(bob, pool.admins)  # read at each request: no restart
    assert http_as(bob, pool.sock, "POST", "/v1/drain", {"on": True})[0] == 200
    assert daemon.call("GET", "/v1/node")["draining"]
    assert http_as(bob, pool.sock, "POST", "/v1/drain", {"on": False})[0] == 200
    status, _ = http_as(bob, pool.sock, "GET", f"/v1/jobs/{job}")  # an admin sees it all
    assert status == 200
    cancelled = gpupool_as(bob, "cancel", str(job), url=daemon.url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert daemon.wait(job)["state"] == "cancelled"


def test_a_daemon_run_by_a_user_serves_that_user_only(tmp_path: Path) -> None:
    root = world_dir()
    try:
        with users(1) as (alice,):
            check_interpreter(alice)
            os.chown(root, alice.uid, alice.gid)
            state = root / "state"
            daemon = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpupool",
                    "serve",
                    "--simulate",
                    "1xA30",
                    "--node-dir",
                    str(root / "node"),
                    "--state-dir",
                    str(state),
                ],
                user=alice.uid,
                group=alice.gid,
                env={"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                sock = state / "gpupool.sock"
                deadline = time.monotonic() + 30
                while not sock.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
                assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
                assert http_as(alice, sock, "GET", "/v1/health")[0] == 200
                # root can open any socket; this daemon still refuses it, on every route
                for path in ("/v1/health", "/v1/jobs", "/docs", "/openapi.json", "/nowhere"):
                    status, refused = http_as(User("root", 0, 0), sock, "GET", path)
                    assert status == 403 and refused == {
                        "error": "PermissionDenied",
                        "message": f"this daemon runs as {alice.name} and serves {alice.name} only",
                    }, path
                refused_group = subprocess.run(
                    [sys.executable, "-m", "gpupool", "serve", "--socket-group", "root"],
                    user=alice.uid,
                    group=alice.gid,
                    env={
                        "PATH": os.environ["PATH"],
                        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                    },
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert refused_group.returncode == 2
                assert "serves its own user only" in refused_group.stderr
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=30)
            assert daemon.returncode == 0, daemon.stderr.read() if daemon.stderr else ""
    finally:
        remove_tree(root)


def test_a_gpu_process_of_anothers_job_shows_its_share_not_its_name(pool: Pool) -> None:
    daemon, alice, bob = pool.daemon, pool.alice, pool.bob
    # the simulated GPUs open to every user, as a real node's /dev/nvidia* are (0666)
    (daemon.node_dir / "state.bin").chmod(0o666)
    # exclusive: a whole GPU, no shim and no arbiter, only the (simulated) driver
    job = pool.submit_as(alice, [sys.executable, CUDA_JOB, "60"], mode="exclusive", compute=100)
    daemon.wait(job, ("running",))

    def of_job(user: User) -> list[dict[str, Any]]:
        status, data = http_as(user, pool.sock, "GET", "/v1/processes")
        assert status == 200
        return [p for p in data["processes"] if p["job"] == job]

    seen = until(lambda: of_job(alice))
    assert seen and all(p["name"] for p in seen), daemon.job(job)["events"]
    hidden = of_job(bob)
    assert [p["pid"] for p in hidden] == [p["pid"] for p in seen]
    assert all(p["name"] is None and p["share"] for p in hidden)


def test_the_watchdogs_events_of_anothers_job_are_left_out(pool: Pool, tmp_path: Path) -> None:
    daemon, bob = pool.daemon, pool.bob
    command = escape_command("unset LD_PRELOAD", tmp_path / "scratch", tmp_path / "unused")
    job = daemon.submit(command, memory=SHARE, compute=10)  # root's, past its share
    wait_for_job_event(daemon, job, "over_share")
    status, seen = http_as(bob, pool.sock, "GET", "/v1/events")
    assert status == 200 and all(e["job_id"] != job for e in seen["events"])
    assert http_as(pool.alice, pool.sock, "GET", "/v1/events")[0] == 200
    add_to_group(bob, pool.admins)
    status, seen = http_as(bob, pool.sock, "GET", "/v1/events")
    assert any(e["job_id"] == job and e["kind"] == "over_share" for e in seen["events"])
