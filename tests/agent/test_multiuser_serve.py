"""The daemon's doors on a shared node: clean stops, its state dir or socket vanishing, the token
file's rules, and what TCP demands (token on every route, Host, JSON bodies, sizes, TLS)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import Daemon, until
from tests.agent.test_daemon_recovery import socket_port

from gpupool.core.errors import ConfigError

TOKEN = "s3cret-token"
BIG = 1 << 20


def _log(daemon: Daemon) -> str:
    return (daemon.root / "serve.log").read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_daemon_cleanly_and_jobs_go_on(daemon: Daemon, sig: int) -> None:
    job = daemon.submit(["sleep", "60"], compute=10)
    daemon.wait(job, ("running",))
    written = daemon.state_dir / "jobs" / str(job) / "pids.json"
    assert until(written.exists)
    pids = json.loads(written.read_text())
    daemon.kill(sig)
    assert daemon.process is not None and daemon.process.returncode == 0, _log(daemon)
    assert not (daemon.state_dir / "gpupool.sock").exists()
    assert _log(daemon).splitlines()[-1] == (
        "gpupool serve: stopped; running jobs go on and are adopted at the next start"
    )
    os.kill(pids["job"], 0)  # still running
    daemon.start()
    assert daemon.job(job)["state"] == "running"


def _replace_socket(path: Path) -> socket.socket:
    path.unlink()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    return other


@pytest.mark.parametrize("how", ["rm -rf the state dir", "unlink the socket", "replace the socket"])
def test_a_vanished_state_dir_or_socket_stops_the_daemon_in_one_line(
    tmp_path: Path, how: str
) -> None:
    daemon = Daemon(tmp_path, "1xA30").start()
    sock = daemon.state_dir / "gpupool.sock"
    other = None
    try:
        if how.startswith("rm"):
            shutil.rmtree(daemon.state_dir)
        elif how.startswith("unlink"):
            sock.unlink()
        else:
            other = _replace_socket(sock)
        assert daemon.process is not None
        daemon.process.wait(timeout=5)  # noticed within about a second
        assert daemon.process.returncode == 7
        gone = daemon.state_dir if how.startswith("rm") else sock
        assert _log(daemon).splitlines()[-1] == (
            f"gpupool: error: {gone} was removed or replaced: stopping (running jobs go on)"
        )
        if other is not None:  # another's socket is left alone
            assert sock.exists()
    finally:
        daemon.stop()
        if other is not None:
            other.close()


def _serve(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "gpupool", "serve", "--simulate", "1xA30"]
    argv += ["--node-dir", str(tmp_path / "node"), "--state-dir", str(tmp_path / "state")]
    return subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=60)


def test_the_token_file_must_be_a_private_regular_file_of_the_daemons_user(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    link = tmp_path / "link"
    link.symlink_to(token)
    listen = ["--listen", "127.0.0.1:1"]
    cases = [
        (token, lambda: token.chmod(0o640), "is open to others (mode 0640): chmod 600"),
        (token, lambda: os.chown(token, 65534, -1), "belongs to uid 65534"),
        (link, lambda: None, "it is a symbolic link"),
        (tmp_path, lambda: None, "is not a regular file"),
    ]
    for path, spoil, words in cases:
        token.chmod(0o600)
        os.chown(token, 0, -1)
        spoil()
        done = _serve(tmp_path, *listen, "--token-file", str(path))
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("gpupool: error: ") and words in done.stderr
    token.chmod(0o600)
    os.chown(token, 0, -1)
    token.write_text("naïve\n")
    done = _serve(tmp_path, *listen, "--token-file", str(token))
    assert done.returncode == 2 and "printable ASCII" in done.stderr
    assert not (tmp_path / "state").exists()


@pytest.fixture
def tcp(tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    with socket_port() as port:
        pass
    extra = ("--listen", f"127.0.0.1:{port}", "--token-file", str(token))
    daemon = Daemon(tmp_path, "1xA30", (*extra, "--allowed-host", "gpu1.example")).start()
    yield daemon, f"http://127.0.0.1:{port}"
    daemon.stop()
    _kill_jobs(daemon)


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_over_tcp_every_route_needs_the_token_and_a_malformed_one_is_401(
    tcp: tuple[Daemon, str],
) -> None:
    daemon, base = tcp
    with httpx.Client(base_url=base) as web:
        for path in ("/docs", "/openapi.json", "/metrics", "/v1/health", "/v1/dashboard", "/"):
            assert web.get(path).status_code == 401, path
            assert web.get(path, headers=AUTH).status_code == 200, path
        for header in (b"Bearer s3cr\xe9t-token", b"Bearer \xff\xfe", b"Basic x"):
            refused = web.get("/v1/jobs", headers={"Authorization": header})
            assert refused.status_code == 401 and refused.json()["error"] == "Unauthorized"
        refused = web.get("/v1/dashboard", headers={"Cookie": b"gpupool_session=\xe9\xff"})
        assert refused.status_code == 401
    with daemon.client() as client:  # on the Unix socket, the docs stay open
        assert client.call("GET", "/openapi.json")["info"]["title"] == "gpupool node daemon"


def test_the_dashboard_session_is_a_signed_cookie_never_the_token(
    tcp: tuple[Daemon, str],
) -> None:
    _, base = tcp
    with httpx.Client(base_url=base) as web:
        assert web.get("/", params={"token": "wrong"}).status_code == 401
        moved = web.get("/", params={"token": TOKEN})
        assert moved.status_code == 303 and moved.headers["location"] == "/"
        cookie = moved.headers["set-cookie"]
        assert TOKEN not in cookie
        assert all(
            word in cookie.lower()
            for word in ("httponly", "samesite=strict", "max-age=43200", "path=/")
        )
        session = web.cookies["gpupool_session"]
        uid, expiry, mac = session.split(".")
        assert uid == "0" and 43190 < int(expiry) - time.time() <= 43200 and len(mac) == 64
        assert web.get("/v1/dashboard").status_code == 200
        assert web.get("/v1/jobs").status_code == 401  # the session opens the dashboard only
        web.cookies.set("gpupool_session", f"{uid}.{int(expiry) + 3600}.{mac}")  # forged
        assert web.get("/v1/dashboard").status_code == 401


def test_a_request_for_another_host_is_refused_on_both_listeners(
    tcp: tuple[Daemon, str],
) -> None:
    daemon, base = tcp
    port = base.rpartition(":")[2]
    with httpx.Client(base_url=base, headers=AUTH) as web:
        for host in ("localhost", f"127.0.0.1:{port}", f"gpu1.example:{port}", "[::1]:1"):
            assert web.get("/v1/health", headers={"Host": host}).status_code == 200, host
        refused = web.get("/v1/health", headers={"Host": f"rebound.example:{port}"})
        assert refused.status_code == 400 and refused.json()["error"] == "InvalidRequest"
        assert "--allowed-host" in refused.json()["message"]
    transport = httpx.HTTPTransport(uds=str(daemon.state_dir / "gpupool.sock"))
    with httpx.Client(transport=transport, base_url="http://gpupool") as local:
        assert local.get("/v1/health").status_code == 200
        assert local.get("/v1/health", headers={"Host": "rebound.example"}).status_code == 400


def test_changes_need_a_json_body_of_at_most_1_mib(tcp: tuple[Daemon, str]) -> None:
    daemon, base = tcp
    job = daemon.submit(["sleep", "60"], compute=10)
    with httpx.Client(base_url=base, headers=AUTH) as web:
        for answer in (
            web.post(f"/v1/jobs/{job}/cancel"),
            web.post("/v1/jobs", content=b"argv=sleep", headers={"Content-Type": "text/plain"}),
            web.post("/v1/drain", data={"on": "true"}),
        ):
            assert answer.status_code == 415 and answer.json()["error"] == "InvalidRequest"
        assert daemon.job(job)["state"] != "cancelled"
        big = {"argv": ["x" * BIG]}
        announced = web.post("/v1/jobs", json=big)
        assert announced.status_code == 413 and announced.json()["error"] == "InvalidRequest"

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"argv": ["'
            for _ in range(20):
                yield b"x" * (BIG // 16)
            yield b'"]}'

        streamed = web.post(
            "/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert streamed.status_code == 413 and "1 MiB" in streamed.json()["message"]
        assert web.post(f"/v1/jobs/{job}/cancel", json={}).status_code == 200
    assert daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"][0]["id"] == job


def test_tls_on_the_tcp_listener_the_unix_socket_stays_plain(tmp_path: Path) -> None:
    cert, key, token = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "token"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    token.write_text(TOKEN)
    token.chmod(0o600)
    with socket_port() as port:
        pass
    listen = ("--listen", f"127.0.0.1:{port}", "--token-file", str(token))
    bad = _serve(tmp_path, *listen, "--tls-cert", str(cert), "--tls-key", str(cert))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith(f"gpupool: error: cannot use --tls-cert {cert}")
    alone = _serve(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key))
    assert alone.returncode == 2 and "add --listen" in alone.stderr
    daemon = Daemon(tmp_path, "1xA30", (*listen, "--tls-cert", str(cert), "--tls-key", str(key)))
    daemon.start()
    try:
        trust = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=trust) as web:
            assert web.get("/v1/health", headers=AUTH).json()["ok"]
            assert web.get("/v1/health").status_code == 401
            moved = web.get("/", params={"token": TOKEN})
            assert "secure" in moved.headers["set-cookie"].lower()
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/v1/health", headers=AUTH, timeout=5)
        assert daemon.call("GET", "/v1/health")["ok"]  # plain HTTP on the socket
        assert f"https://127.0.0.1:{port}" in _log(daemon)
    finally:
        daemon.stop()


def test_the_systemd_unit_makes_the_group_and_stops_on_a_configuration_error() -> None:
    unit = (Path(__file__).resolve().parents[2] / "deploy/systemd/gpupool.service").read_text()
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0] != "#")
    assert "groupadd --system gpupool" in lines["ExecStartPre"]
    assert lines["RestartPreventExitStatus"] == str(ConfigError.exit_code)
    assert lines["StateDirectoryMode"] == "0750"
    options = lines["ExecStart"].split()[2:]
    usage = subprocess.run(
        [sys.executable, "-m", "gpupool", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COLUMNS="200"),
    ).stdout
    for option in options:
        assert not option.startswith("--") or option in usage, option
