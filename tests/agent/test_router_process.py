"""The router as a process of its own: it outlives the daemon (killed with -9, or stopped to be
restarted), a restarted daemon attaches to it again, the daemon restarts it when it dies, and
only the daemon's user may drive its control socket (real daemon, router, replicas, users)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import Daemon, cli, until
from tests.agent.multiuser_support import group_daemon
from tests.agent.services_support import MODEL_SERVER, Load, Routed, free_port, routed_on
from tests.users import run_as

routed = routed_on()
#: two workers, each pausing 40 ms after an answer: about 50 requests/s
RATE = {"workers": 2, "pause": 0.04}


def _router_pid(daemon: Daemon) -> int:
    """The router process's pid (once it has started and written it)."""
    pid_file = daemon.state_dir / "router.pid"
    assert until(pid_file.exists), "no router process"
    return int(pid_file.read_text())


def _restarted(routed: Routed) -> Daemon:
    """A new daemon on the same state dir and the same --router address."""
    return Daemon(routed.daemon.root, routed.daemon.spec, routed.daemon.extra).start()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_no_request_is_lost_while_the_daemon_is_killed_or_stopped_and_restarted(
    routed: Routed, sig: int
) -> None:
    routed.create("steady", min_replicas=2, max_replicas=2, concurrency=8)
    routed.ready("steady", 2)
    pid_file = routed.daemon.state_dir / "router.pid"
    until(pid_file.exists, timeout=5)
    router = pid_file.read_text() if pid_file.exists() else None
    load = Load(f"{routed.base}/steady/infer", **RATE)  # type: ignore[arg-type]
    with load.running():
        time.sleep(1)
        routed.daemon.kill(sig)
        time.sleep(1.5)  # no daemon at all meanwhile
        served_alone = load.statuses[200]
        routed.daemon = _restarted(routed)
        assert routed.ready("steady", 2)
        time.sleep(1)
    assert set(load.statuses) == {200}, load.statuses  # none lost, none refused
    assert load.statuses[200] > 100 and served_alone > 50, load.statuses
    assert router is not None and pid_file.read_text() == router  # attached to, not restarted
    # the restarted daemon mirrors the router's counters, those from before it included
    counted = until(
        lambda: routed.service("steady")["statuses"].get("200", 0) >= load.statuses[200]
    )
    assert counted, (routed.service("steady"), load.statuses)
    # and drives it: a third replica takes requests
    assert cli("service", "scale", "steady", "3..3", url=routed.daemon.url).returncode == 0
    routed.ready("steady", 3)
    with ThreadPoolExecutor(3) as pool:  # three at once: one on each (fewest in flight)
        answers = pool.map(lambda _: httpx.get(f"{routed.base}/steady/infer?delay=1"), range(3))
        ports = {answer.json()["port"] for answer in answers}
    assert len(ports) == 3, ports


def test_a_router_killed_with_9_is_started_again_by_the_daemon(routed: Routed) -> None:
    routed.create("echo", concurrency=8)
    routed.ready("echo")
    assert httpx.get(f"{routed.base}/echo/infer").status_code == 200
    assert until(lambda: routed.service("echo")["statuses"].get("200") == 1)
    first = _router_pid(routed.daemon)
    os.kill(first, signal.SIGKILL)
    assert until(lambda: _router_pid(routed.daemon) != first, timeout=20)

    def answered() -> bool:
        try:
            return httpx.get(f"{routed.base}/echo/infer", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    assert until(answered, timeout=20)
    # the new process counts on from where the old one stopped
    assert until(lambda: routed.service("echo")["statuses"].get("200", 0) >= 2)
    log = (routed.daemon.state_dir / "router.log").read_text()
    assert log.count("router: serving") == 2, log


def test_a_daemon_without_router_stops_the_one_it_finds(routed: Routed) -> None:
    routed.create("echo")
    routed.ready("echo")
    pid = _router_pid(routed.daemon)
    routed.daemon.kill(signal.SIGTERM)
    routed.daemon = Daemon(routed.daemon.root, routed.daemon.spec).start()
    assert until(lambda: not Path(f"/proc/{pid}").exists(), timeout=20)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{routed.base}/echo/infer")


_PROBE = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX)
try:
    sock.connect(sys.argv[1])
except OSError as err:
    print(type(err).__name__); sys.exit()
sock.settimeout(5)
try:
    sock.sendall(json.dumps({"t": "table", "services": []}).encode() + b"\\n")
    print("hello" if sock.recv(4096) else "closed")
except OSError:
    print("closed")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: needs root")
def test_an_outsider_cannot_drive_the_control_socket() -> None:
    port = free_port()
    with group_daemon("2xA100-40GB", 1, extra=("--router", f"127.0.0.1:{port}")) as (daemon, [u]):
        routed = Routed(daemon, port)
        routed.create("kept", argv=[sys.executable, MODEL_SERVER, "--memory-mib", "64"])
        routed.ready("kept")
        control = daemon.state_dir / "router.sock"
        assert until(control.exists)
        assert (control.stat().st_mode & 0o777, control.stat().st_uid) == (0o600, 0)
        tried = run_as(u, [sys.executable, "-c", _PROBE, str(control)])
        assert tried.stdout.strip() == "PermissionError", tried
        control.chmod(0o666)  # an admin's mistake: the router still asks the kernel who calls
        tried = run_as(u, [sys.executable, "-c", _PROBE, str(control)])
        assert tried.stdout.strip() == "closed", tried
        assert httpx.get(f"{routed.base}/kept/infer", timeout=10).status_code == 200
        log = (daemon.state_dir / "router.log").read_text()
        assert f"control connection from uid {u.uid} refused" in log, log
        with socket.socket(socket.AF_UNIX) as sock:  # root's is the daemon's user: answered
            sock.connect(str(control))
            assert sock.recv(4096).startswith(b'{"t":"hello"')


def test_a_router_of_another_version_is_told_to_exit_and_replaced(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    port = free_port()
    older = socket.socket(socket.AF_UNIX)  # a router of an older gpupool, on the same address
    older.bind(str(state / "router.sock"))
    older.listen()
    told: list[bytes] = []

    def serve_once() -> None:
        connection, _ = older.accept()
        hello = {"t": "hello", "pid": 1, "listen": f"127.0.0.1:{port}", "started": 0, "version": 0}
        connection.sendall(json.dumps(hello).encode() + b"\n")
        connection.settimeout(10)
        told.append(connection.recv(4096))

    thread = threading.Thread(target=serve_once, daemon=True)
    thread.start()
    daemon = Daemon(tmp_path, "2xA100-40GB", ("--router", f"127.0.0.1:{port}")).start()
    try:
        thread.join(10)
        assert told == [b'{"t":"exit"}\n']
        assert _router_pid(daemon) != 1
        routed = Routed(daemon, port)
        routed.create("echo")
        routed.ready("echo")
        assert httpx.get(f"{routed.base}/echo/infer", timeout=10).status_code == 200
    finally:
        older.close()
        daemon.stop()
        _kill_jobs(daemon)
