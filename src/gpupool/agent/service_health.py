"""A replica's port: picking a free one, and checking that it serves, and whose it is.

A replica listens on 127.0.0.1:$PORT. Any local user may bind a free port, so before a replica
is taken as ready its listening socket must belong to the service's owner (the uid the kernel
gives the socket, isolation/sock_owner.py): another user's process squatting the port would
otherwise be sent the service's requests. Then its health path must answer 2xx.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable

from gpupool.isolation.sock_owner import listener_uid

#: seconds a health check may take
HEALTH_TIMEOUT_S = 1.0
#: bytes read for the status line at most
MAX_STATUS_LINE = 4096


def free_port(taken: Iterable[int]) -> int:
    """A port the kernel says is free on 127.0.0.1 now and no other replica was given."""
    avoid = set(taken)
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port
    raise OSError("no free TCP port on 127.0.0.1")


def check(port: int, path: str, owner: int, timeout: float = HEALTH_TIMEOUT_S) -> str | None:
    """None when the replica on `port` is its owner's and answers `path` with 2xx, else why not
    (one line). The whole check takes `timeout` at most, however slowly the replica answers: a
    replica is its owner's code, and must not hold the daemon's checker."""
    uid = listener_uid(port)
    if uid is None:
        return f"nothing listens on its $PORT ({port})"
    if uid != owner:
        return f"port {port} is held by uid {uid}, not by the service's owner (uid {owner})"
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            answer = b""
            while b"\r\n" not in answer and len(answer) < MAX_STATUS_LINE:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no status line within {timeout:g}s")
                sock.settimeout(left)
                piece = sock.recv(MAX_STATUS_LINE)
                if not piece:
                    break
                answer += piece
    except OSError as err:
        return f"GET {path} on port {port} failed: {type(err).__name__}: {err}"
    words = answer.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
        return f"GET {path} on port {port} did not answer HTTP"
    status = int(words[1])
    if not 200 <= status < 300:
        return f"GET {path} on port {port} answered {status}"
    return None
