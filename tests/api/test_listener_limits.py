"""The daemon's listeners bounded: a head's size and header lines (431), the time to send a head,
an idle connection, connections per peer and in all; on a real daemon over its real Unix socket
and TCP listener (docs/limits.md)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.conftest import serving
from tests.agent.daemon_support import Daemon, cli
from tests.agent.multiuser_support import group_daemon
from tests.agent.test_daemon_recovery import socket_port
from tests.users import gpupool_as

TOKEN = "s3cret-token"
HEAD_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 1.0
#: how much longer than its deadline a connection may take to be closed on a busy machine
SLACK_S = 4.0
MiB = 1 << 20


def _serve(tmp_path: Path, *limits: str) -> Iterator[tuple[Daemon, int]]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    with socket_port() as port:
        pass
    listen = ("--listen", f"127.0.0.1:{port}", "--token-file", str(token))
    options = [arg for limit in limits for arg in ("--listener-limit", limit)]
    for daemon in serving(tmp_path, "1xA30", *listen, *options):
        yield daemon, port


@pytest.fixture
def short(tmp_path: Path) -> Iterator[tuple[Daemon, int]]:
    """A daemon whose connections have 1 s to send a head, or to send their next request."""
    yield from _serve(
        tmp_path, f"head-timeout={HEAD_TIMEOUT_S}s", f"idle-timeout={IDLE_TIMEOUT_S}s"
    )


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[tuple[Daemon, int]]:
    """A daemon taking at most 8 connections from one peer, 12 in all, on each listener."""
    yield from _serve(tmp_path, "max-connections-per-peer=8", "max-connections=12")


def _tcp(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))


def _unix(daemon: Daemon) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    conn.connect(str(daemon.state_dir / "gpupool.sock"))
    return conn


def _health(host: str = "127.0.0.1") -> bytes:
    return (
        f"GET /v1/health HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    ).encode()


def _answer(conn: socket.socket) -> tuple[int, bytes]:
    """The status and the body of one response (read until its Content-Length is there)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return int(head.split()[1]), body


def _closed_within(conn: socket.socket, seconds: float) -> float | None:
    """Seconds until the daemon closes `conn` (reading and dropping what comes), or None if it
    is still open after `seconds`."""
    start = time.monotonic()
    conn.settimeout(seconds)
    try:
        while conn.recv(65536):
            conn.settimeout(max(0.01, seconds - (time.monotonic() - start)))
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def _served_soon(port: int, source: str) -> bool:
    """Whether a connection from `source` is served within SLACK_S (the daemon sees a closed
    connection a moment after its client closed it)."""
    deadline = time.monotonic() + SLACK_S
    while time.monotonic() < deadline:
        with _tcp(port, source) as conn, contextlib.suppress(AssertionError, OSError):
            conn.sendall(_health())
            return _answer(conn)[0] == 200
        time.sleep(0.1)
    return False


def _rss(daemon: Daemon) -> int:
    assert daemon.process is not None
    status = Path(f"/proc/{daemon.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_64_mib_head_is_refused_with_431_and_the_daemon_does_not_grow_by_it(
    short: tuple[Daemon, int],
) -> None:
    daemon, port = short
    before = _rss(daemon)
    conn = _tcp(port)
    head = (
        b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (64 * MiB) + b"\r\n\r\n"
    )

    def send() -> None:
        with contextlib.suppress(OSError):  # the daemon closes before taking it all
            conn.sendall(head)

    sender = threading.Thread(target=send)
    sender.start()
    status, body = _answer(conn)
    sender.join(timeout=60)
    conn.close()
    assert status == 431
    assert json.loads(body) == {
        "error": "InvalidRequest",
        "message": "a request head of more than 32768 bytes",
    }
    assert _rss(daemon) - before < 16 * MiB
    with _unix(daemon) as unix:  # an authenticated caller too
        unix.sendall(
            b"GET /v1/health HTTP/1.1\r\nHost: gpupool\r\nX-Big: " + b"a" * MiB + b"\r\n\r\n"
        )
        assert _answer(unix)[0] == 431
    assert daemon.call("GET", "/v1/health")


def test_a_head_of_more_than_100_header_lines_is_refused_with_431(
    short: tuple[Daemon, int],
) -> None:
    daemon, _ = short
    many = "".join(f"X-Line-{n}: {n}\r\n" for n in range(101))
    with _unix(daemon) as conn:
        conn.sendall(f"GET /v1/health HTTP/1.1\r\nHost: gpupool\r\n{many}\r\n".encode())
        status, body = _answer(conn)
    assert status == 431
    assert json.loads(body)["message"] == "a request head of more than 100 header lines"
    with _unix(daemon) as conn:  # 100 lines in all are fine
        fewer = many[: many.rindex("X-Line-99")]
        conn.sendall(f"GET /v1/health HTTP/1.1\r\nHost: gpupool\r\n{fewer}\r\n".encode())
        assert _answer(conn)[0] == 200


def test_a_connection_that_trickles_half_a_head_is_closed_at_the_head_deadline(
    short: tuple[Daemon, int],
) -> None:
    _, port = short
    with _tcp(port) as conn:
        conn.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        start = time.monotonic()
        conn.settimeout(0.3)
        closed = False
        while not closed and time.monotonic() - start < HEAD_TIMEOUT_S + SLACK_S:
            try:
                conn.sendall(b"X")  # a byte at a time: never idle, never a whole head
                closed = conn.recv(1) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed, "the half head's connection is still open"
        assert time.monotonic() - start >= HEAD_TIMEOUT_S * 0.9


def test_an_idle_connection_is_closed_before_and_between_requests(
    short: tuple[Daemon, int],
) -> None:
    daemon, port = short
    silent = [_tcp(port), _unix(daemon)]
    with _unix(daemon) as kept:
        kept.sendall(_health("gpupool"))
        assert _answer(kept)[0] == 200
        for conn in [*silent, kept]:
            took = _closed_within(conn, IDLE_TIMEOUT_S + SLACK_S)
            assert took is not None, f"{conn} still open"
    for conn in silent:
        conn.close()


def test_a_peer_past_its_connections_is_closed_at_once_the_unix_socket_still_answers(
    capped: tuple[Daemon, int],
) -> None:
    daemon, port = capped
    held = [_tcp(port) for _ in range(8)]
    held += [_tcp(port, "127.0.0.2") for _ in range(4)]
    try:
        for source in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):  # per peer, then in all
            with _tcp(port, source) as refused:
                assert _closed_within(refused, SLACK_S) is not None, source
        assert daemon.call("GET", "/v1/health")
        held.pop().close()  # one of 127.0.0.2's: room in all again, for another peer
        assert _served_soon(port, "127.0.0.3")
        held[0].sendall(_health())  # the ones held are served
        assert _answer(held[0])[0] == 200
    finally:
        for conn in held:
            conn.close()


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        ("head-timeout=0s", "must be a positive duration"),
        ("max-headers=many", "must be a positive whole number"),
        ("max-sockets=3", "NAME one of max-head-bytes, max-headers, head-timeout"),
    ],
)
def test_a_wrong_listener_limit_is_one_line(tmp_path: Path, limit: str, said: str) -> None:
    done = cli("serve", "--state-dir", str(tmp_path / "state"), "--listener-limit", limit, url="")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert not (tmp_path / "state").exists()


def test_on_the_unix_socket_the_count_is_per_uid_another_user_still_gets_in() -> None:
    limit = ("--listener-limit", "max-connections-per-peer=4")
    with group_daemon("1xA30", 1, limit) as (daemon, (alice,)):
        held = [_unix(daemon) for _ in range(4)]
        try:
            with _unix(daemon) as refused:
                assert _closed_within(refused, SLACK_S) is not None
            done = gpupool_as(alice, "ps", url=daemon.url)
            assert done.returncode == 0, done.stderr
            held[0].sendall(_health("gpupool"))
            assert _answer(held[0])[0] == 200
        finally:
            for conn in held:
                conn.close()
