"""Serve the app with uvicorn on the Unix socket (peer uid by SO_PEERCRED) and optionally TCP.

uvicorn does not hand the connection to the app, so the peer's credentials are read where the
connection is made, by the protocol of api/listener.py, which also bounds what each connection
may hold (ListenerLimits); each listener has its own budget of connections.

The socket is the node's door: 0660 root:GROUP (the socket group) in a state dir 0750
root:GROUP, or 0600 in a 0700 state dir without one. TLS, when asked, is for the TCP listener
only. A signal stops the server and returns, so the daemon's own cleanup runs; so does the state
dir or the socket vanishing (an admin's `rm -rf`, another daemon's socket in its place), which is
noticed within WATCH_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
import signal
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from gpupool.api.listener import Budget, ListenerProtocol
from gpupool.core.errors import ConfigError, InvalidRequest
from gpupool.core.settings import LISTENER, ListenerLimits

#: sun_path is 108 bytes on Linux, one of them the terminating NUL
MAX_SOCKET_PATH = 107
#: how often the server checks that its state dir and socket are still the ones it made
WATCH_S = 0.5
#: the identity of a file: (device, inode)
Identity = tuple[int, int]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: the kernel's queue of each listener's connections not yet accepted: the event loop (uvloop)
#: accepts all of it at each turn, so under a flood of TCP connections a turn, and with it every
#: other client's request, waits as long as the queue takes to accept (and refuse): with 1,024
#: the Unix socket's p99 under 10,000 flooding connections was about 50 ms on a busy 2-core
#: machine, with 64 28 to 40 ms. A client past the queue retries its SYN; the daemon empties the
#: queue at every turn, so real bursts fit.
UNIX_QUEUE = 128
TCP_QUEUE = 64


def unix_socket(path: Path, gid: int | None) -> socket.socket:
    """A listening Unix socket at `path`: 0660 owner:`gid`, or 0600 without a group. A stale file
    there is replaced (the caller holds the state dir's lock, so no live daemon owns it)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"cannot listen on {path}: a Unix socket path may have at most {MAX_SOCKET_PATH} "
            "bytes; use a shorter --state-dir"
        )
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # bind makes the file with the umask's mode: 0600 from its first instant, opened to the group
    # once it has the group (a socket's own descriptor cannot chown the file on Linux; the path is
    # safe to use, in a directory only the daemon's user may write)
    umask = os.umask(0o177)
    try:
        sock.bind(str(path))
        if gid is not None:
            os.chown(path, -1, gid, follow_symlinks=False)
            os.chmod(path, 0o660)
    except OSError as err:
        sock.close()
        raise ConfigError(f"cannot listen on {path}: {err.strerror}") from err
    finally:
        os.umask(umask)
    sock.listen(UNIX_QUEUE)
    return sock


def identity(path: Path) -> Identity | None:
    """`path`'s (device, inode), not following a link; None when nothing is there."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def remove_socket(path: Path, made: Identity | None) -> None:
    """Unlink the socket at `path` if it is still the one this daemon made, not a newer
    daemon's."""
    if made is not None and identity(path) == made:
        path.unlink(missing_ok=True)


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server TLS context from a PEM certificate (chain) and its key, or one line on why not."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        reason = getattr(err, "strerror", None) or getattr(err, "reason", None) or str(err)
        raise ConfigError(f"cannot use --tls-cert {cert} --tls-key {key}: {reason}") from err
    return context


def tcp_socket(listen: str, option: str = "--listen") -> socket.socket:
    """A listening TCP socket for `HOST:PORT` (given as `option`)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidRequest(f"invalid {option} {listen!r}: use HOST:PORT, e.g. 127.0.0.1:8470")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as err:
        sock.close()
        raise ConfigError(f"cannot listen on {listen}: {err.strerror}") from err
    sock.listen(TCP_QUEUE)
    return sock


def _raise_open_file_limit() -> int:
    """The soft limit on open files up to the hard one (the new soft limit): the daemon keeps
    each running share's accounting region open between scrapes, and the default soft limit (1024
    on most systems) would be reached near a thousand running shares with the clients'
    connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        # a container may forbid it: the soft limit then stands
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class _Server(uvicorn.Server):
    """uvicorn's server, changed where the daemon needs it: TLS on TCP sockets only, signals that
    stop it and nothing more, and a watch on the state dir and the socket."""

    def __init__(
        self,
        config: uvicorn.Config,
        tls: ssl.SSLContext | None,
        watched: dict[Path, Identity],
        limits: ListenerLimits,
        open_files: int,
    ) -> None:
        super().__init__(config)
        self.tls = tls
        self.watched = watched
        self.limits = limits
        self.open_files = open_files
        #: why the server stopped by itself, if it did
        self.gone: str | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn's own raises the signal again after shutting down, which kills the process
        # before the daemon's cleanup (the socket, the "stopped" line) and exits with 143
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn applies one TLS setting to every socket; the Unix socket stays plain
        await self.lifespan.startup()
        self.servers = []
        for sock in sockets or ():
            self.servers.append(await self._listen(sock))
        self.started = True

    async def _listen(self, sock: socket.socket) -> asyncio.Server:
        """Serve `sock` with a budget of connections of its own, so that a flood of one
        listener leaves the other usable."""
        budget = Budget.of_listener(self.limits, self.open_files)

        def protocol() -> asyncio.Protocol:
            return ListenerProtocol(
                self.config, self.server_state, self.lifespan.state, budget, self.limits
            )

        tls = self.tls if sock.family != socket.AF_UNIX else None
        # a TLS handshake comes before the protocol sees the connection: bound its time too
        handshake = self.limits.head_timeout_s if tls is not None else None
        queue = UNIX_QUEUE if sock.family == socket.AF_UNIX else TCP_QUEUE
        return await asyncio.get_running_loop().create_server(
            protocol, sock=sock, ssl=tls, backlog=queue, ssl_handshake_timeout=handshake
        )

    async def on_tick(self, counter: int) -> bool:
        if counter % round(WATCH_S / 0.1) == 0 and self.gone is None:
            self.gone = self._missing()
            self.should_exit = self.should_exit or self.gone is not None
        return await super().on_tick(counter)

    def _missing(self) -> str | None:
        for path, made in self.watched.items():
            if identity(path) != made:
                return f"{path} was removed or replaced: stopping (running jobs go on)"
        return None


def settle() -> None:
    """Take what the daemon built at start (FastAPI's routes and models, the agent and its
    parts) out of the collector's reach: every full collection would walk it all again, and
    under a busy listing (`ps --all` over 10,000 jobs allocates as many rows a call) those
    collections doubled the route's p99 (docs/benchmarks/ps-latency.md)."""
    gc.freeze()


def serve(
    app: Any,
    sockets: list[socket.socket],
    tls: ssl.SSLContext | None = None,
    watched: dict[Path, Identity] | None = None,
    limits: ListenerLimits = LISTENER,
) -> str | None:
    """Serve until SIGINT or SIGTERM (None), or until a path of `watched` is no longer the file
    it was (the reason); `tls` for the TCP sockets; each connection within `limits`."""
    open_files = _raise_open_file_limit()
    settle()
    config = uvicorn.Config(
        app,
        http=ListenerProtocol,
        # the daemon serves no WebSocket: an Upgrade header stays an ordinary request
        ws="none",
        lifespan="off",
        log_level="warning",
        access_log=False,
        # uvicorn's own lines go through the daemon's log, in its format (agent/logs.py)
        log_config=None,
        # no proxy stands in front: a client's X-Forwarded-For must not change who it appears to
        # be (and it is one middleware less on every request)
        proxy_headers=False,
    )
    server = _Server(config, tls, watched or {}, limits, open_files)
    server.run(sockets=sockets)
    return server.gone
