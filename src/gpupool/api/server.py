"""Serve the app with uvicorn on the Unix socket (peer uid by SO_PEERCRED) and optionally TCP.

uvicorn does not hand the connection to the app, so the peer's credentials are read where the
connection is made: a subclass of uvicorn's h11 protocol asks the socket for SO_PEERCRED in
`connection_made` and wraps the app so that each request's scope carries the uid (or marks the
connection as TCP, where the bearer token decides).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from gpupool.api.app import OVER_TCP, PEER_UID
from gpupool.core.errors import ConfigError, InvalidRequest

Scope = MutableMapping[str, Any]
#: sun_path is 108 bytes on Linux, one of them the terminating NUL
MAX_SOCKET_PATH = 107
Asgi = Callable[[Scope, Any, Any], Awaitable[None]]


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class PeerCredProtocol(H11Protocol):
    """uvicorn's h11 protocol, with the caller's identity added to every request's scope."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        inner: Asgi = self.app
        extra: dict[str, Any]
        if sock is not None and sock.family == socket.AF_UNIX:
            extra = {PEER_UID: peer_uid(sock)}
        else:
            extra = {OVER_TCP: True}

        async def app(scope: Scope, receive: Any, send: Any) -> None:
            scope.update(extra)
            await inner(scope, receive, send)

        self.app = app


def unix_socket(path: Path) -> socket.socket:
    """A listening Unix socket at `path` (mode 0660); a stale file there is replaced (the
    caller holds the state dir's lock, so no live daemon owns it)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"cannot listen on {path}: a Unix socket path may have at most {MAX_SOCKET_PATH} "
            "bytes; use a shorter --state-dir"
        )
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except OSError as err:
        sock.close()
        raise ConfigError(f"cannot listen on {path}: {err.strerror}") from err
    os.chmod(path, 0o660)
    sock.listen(128)
    return sock


def tcp_socket(listen: str) -> socket.socket:
    """A listening TCP socket for `HOST:PORT`."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidRequest(f"invalid --listen {listen!r}: use HOST:PORT, e.g. 127.0.0.1:8470")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as err:
        sock.close()
        raise ConfigError(f"cannot listen on {listen}: {err.strerror}") from err
    sock.listen(128)
    return sock


def _raise_open_file_limit() -> None:
    """The soft limit on open files up to the hard one: the daemon keeps each running share's
    accounting region open between scrapes, and the default soft limit (1024 on most systems)
    would be reached near a thousand running shares with the clients' connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        # a container may forbid it: the soft limit then stands
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(app: Any, sockets: list[socket.socket]) -> None:
    """Run until SIGINT or SIGTERM."""
    _raise_open_file_limit()
    config = uvicorn.Config(
        app, http=PeerCredProtocol, lifespan="off", log_level="warning", access_log=False
    )
    uvicorn.Server(config).run(sockets=sockets)
