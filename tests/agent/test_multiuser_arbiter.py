"""Two real users' compute shares on one simulated GPU through the daemon, on a host with
fs.protected_regular=1, arbitrated by the node's trusted arbiter: each within 5 points of its
cap while a process of one of them writes garbage into every file it can write under /dev/shm,
the node directory and the state directory; and the arbiter killed -9 mid-run, started again by
the daemon, the shares rejoining it.

The node directory's state.bin is left out of the garbage: it is the simulated GPU itself (every
process on the simulated driver maps it read-write, as no tenant can write a real GPU's state)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.daemon_support import Daemon, until
from tests.agent.multiuser_support import group_daemon
from tests.users import User, gpupool_as, run_as

from gpupool.devices.sim.state import STATE_FILE, SimState
from gpupool.isolation.arbiter import lease_clients, view_file
from gpupool.isolation.arbiter_control import node_arbiter_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: needs root")

REPO = Path(__file__).resolve().parents[2]
SECONDS = 6
POINTS = 0.05

#: as one of the users: every regular file it can open for writing under the given
#: directories gets random bytes, again and again, for the given seconds; prints the count
GARBAGE = r"""
import os, sys, time
roots, until, hits = sys.argv[2:], time.monotonic() + float(sys.argv[1]), set()
while time.monotonic() < until:
    for root in roots:
        for where, dirs, files in os.walk(root):
            for name in files:
                path = os.path.join(where, name)
                if name == "state.bin":
                    continue  # the simulated GPU itself
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                except OSError:
                    continue
                try:
                    size = os.fstat(fd).st_size or 64
                    os.pwrite(fd, os.urandom(min(size, 1 << 16)), 0)
                    hits.add(path)
                except OSError:
                    pass
                finally:
                    os.close(fd)
    time.sleep(0.05)
print(len(hits))
"""


@pytest.fixture
def two_users() -> Iterator[tuple[Daemon, User, User, Path]]:
    with group_daemon("1xA100-40GB") as (daemon, (alice, bob)):
        client = daemon.root / "shim_client"
        subprocess.run(
            [
                "gcc",
                "-O2",
                "-pthread",
                f"-I{REPO / 'native' / 'include'}",
                "-o",
                str(client),
                str(REPO / "tests" / "native" / "progs" / "shim_client.c"),
                "-ldl",
            ],
            check=True,
        )
        client.chmod(0o755)
        yield daemon, alice, bob, client


def _submit(daemon: Daemon, user: User, client: Path, compute: str, seconds: int) -> int:
    argv = ["--", str(client), "run", str(seconds), "kernel"]
    done = gpupool_as(
        user, "submit", "--compute", compute, "--memory", "2Gi", *argv, url=daemon.url
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def _running(daemon: Daemon, ids: list[int]) -> bool:
    jobs = {job["id"]: job for job in daemon.call("GET", "/v1/jobs")["jobs"]}
    return all(jobs.get(i, {}).get("state") == "running" for i in ids)


def _rate(daemon: Daemon, job_id: int) -> float:
    """Launches per second of a finished job (its `run LAUNCHES ELAPSED_NS` line)."""
    assert until(lambda: _ended(daemon, job_id), timeout=90), job_id
    out = (daemon.state_dir / "jobs" / str(job_id) / "stdout").read_text().split()
    assert out[:1] == ["run"], (out, (daemon.state_dir / "jobs" / str(job_id) / "stderr"))
    return int(out[1]) * 1e9 / int(out[2])


def _ended(daemon: Daemon, job_id: int) -> bool:
    job = daemon.call("GET", f"/v1/jobs/{job_id}")
    return job["state"] not in ("queued", "running")


def _protected() -> None:
    if Path("/proc/sys/fs/protected_regular").read_text().strip() == "0":
        pytest.fail("run with fs.protected_regular=1 (as .ci/run sets it): real hosts have it")


def test_a_tenant_writing_garbage_everywhere_leaves_the_other_share_alone(
    two_users: tuple[Daemon, User, User, Path],
) -> None:
    _protected()
    daemon, alice, bob, client = two_users
    base = _rate(daemon, _submit(daemon, bob, client, "100", 2))
    ids = [
        _submit(daemon, alice, client, "30", SECONDS),
        _submit(daemon, bob, client, "70", SECONDS),
    ]
    assert until(lambda: _running(daemon, ids)), daemon.call("GET", "/v1/jobs")
    roots = ["/dev/shm", str(daemon.node_dir), str(daemon.state_dir)]
    # a file of alice's own in /dev/shm: the garbage does reach what she may write
    own = Path(f"/dev/shm/gpupool-test-{alice.name}")
    own.write_bytes(bytes(64))
    os.chown(own, alice.uid, alice.gid)
    try:
        vandal = run_as(
            alice, [sys.executable, "-c", GARBAGE, str(SECONDS - 1), *roots], timeout=SECONDS + 30
        )
        assert vandal.returncode == 0, vandal.stderr
        assert int(vandal.stdout) >= 1 and own.read_bytes() != bytes(64)
    finally:
        own.unlink()
    mine, theirs = (_rate(daemon, job_id) / base for job_id in ids)
    # bob's share is untouched; alice's, whose own files got garbage, never gets above its cap
    assert abs(theirs - 0.70) <= POINTS, (mine, theirs)
    assert mine <= 0.30 + POINTS, (mine, theirs)
    # nothing of the arbiter's was writable: its views and sockets are root's
    arbiter = node_arbiter_dir(daemon.node_dir)
    assert all(p.stat().st_uid == 0 for p in arbiter.iterdir())


def _arbiter_pid(directory: Path) -> int:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"gpupool-arbiterd") and argv[1:2] == [str(directory).encode()]:
            return int(proc.name)
    raise AssertionError(f"no arbiter runs in {directory}")


def test_the_arbiter_killed_mid_run_is_started_again_and_the_shares_rejoin(
    two_users: tuple[Daemon, User, User, Path],
) -> None:
    _protected()
    daemon, alice, bob, client = two_users
    base = _rate(daemon, _submit(daemon, bob, client, "100", 2))
    ids = [
        _submit(daemon, alice, client, "30", SECONDS),
        _submit(daemon, bob, client, "70", SECONDS),
    ]
    assert until(lambda: _running(daemon, ids)), daemon.call("GET", "/v1/jobs")
    directory = node_arbiter_dir(daemon.node_dir)
    state = SimState.open(daemon.node_dir / STATE_FILE)
    uuid = state.gpu(0).uuid
    state.close()
    view = view_file(directory, uuid)
    assert until(lambda: len(lease_clients(view)) == 2, timeout=10)
    first = _arbiter_pid(directory)
    os.kill(first, signal.SIGKILL)
    time.sleep(0.5)
    # the daemon starts it again and registers both shares; their processes rejoin
    assert until(lambda: _arbiter_pid(directory) != first, timeout=10)
    assert until(lambda: len(lease_clients(view_file(directory, uuid))) == 2, timeout=10)
    for job_id, cap in zip(ids, (0.30, 0.70), strict=True):
        # about a second alone of six: each never above its cap, and not far below it
        rate = _rate(daemon, job_id) / base
        assert cap - 2 * POINTS <= rate <= cap + POINTS, (job_id, rate)


def test_two_users_exec_without_the_daemon_each_with_their_own_arbiter(
    two_users: tuple[Daemon, User, User, Path],
) -> None:
    """`gpupool exec` of two users at once, no daemon involved (each on a simulated node of
    their own: a node directory is its maker's): each gets a private arbiter of their own (0700,
    in their runtime directory), nothing is created in another user's file, and both run their
    share arbitrated."""
    _protected()
    _daemon, alice, bob, client = two_users
    argv = ["-m", "gpupool", "exec", "--simulate", "1xA30", "--compute", "30", "--"]
    runs = [
        subprocess.Popen(
            [sys.executable, *argv, str(client), "run", "1", "kernel"],
            user=user.uid,
            group=user.gid,
            env={
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": str(REPO / "src"),
                "HOME": "/nonexistent",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for user in (alice, bob)
    ]
    try:
        for user, run in zip((alice, bob), runs, strict=True):
            _, err = run.communicate(timeout=60)
            assert run.returncode == 0, err
            assert "compute use on GPU 0" in err and "holds its compute cap alone" not in err, err
            private = Path(f"/tmp/gpupool-{user.uid}")
            found = private.stat()
            assert (found.st_uid, found.st_mode & 0o777) == (user.uid, 0o700)
            assert all(p.stat().st_uid == user.uid for p in private.rglob("*"))
    finally:
        for user in (alice, bob):
            shutil.rmtree(f"/tmp/gpupool-{user.uid}", ignore_errors=True)
            shutil.rmtree(f"/tmp/gpupool-sim-{user.uid}", ignore_errors=True)
