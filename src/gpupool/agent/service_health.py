"""A replica's port: picking a free one, and checking that it serves, and whose it is.

A replica listens on 127.0.0.1:$PORT. Any local user may bind a free port, so before a replica
is taken as ready its listening socket must belong to the service's owner (the uid that
/proc/net/tcp gives the socket): another user's process squatting the port would otherwise be
sent the service's requests. Then its health path must answer 2xx.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterable
from pathlib import Path

#: seconds a health check may take
HEALTH_TIMEOUT_S = 1.0
#: TCP_LISTEN in /proc/net/tcp's `st` column
_LISTEN = "0A"
_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


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


def listener_uid(port: int) -> int | None:
    """The uid owning the socket listening on `port` (any local address), None if none does."""
    wanted = f"{port:04X}"
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and fields[3] == _LISTEN and fields[1].rsplit(":", 1)[-1] == wanted:
                return int(fields[7])
    return None


def check(port: int, path: str, owner: int, timeout: float = HEALTH_TIMEOUT_S) -> str | None:
    """None when the replica on `port` is its owner's and answers `path` with 2xx, else why not
    (one line)."""
    uid = listener_uid(port)
    if uid is None:
        return f"nothing listens on its $PORT ({port})"
    if uid != owner:
        return f"port {port} is held by uid {uid}, not by the service's owner (uid {owner})"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        response.read(65536)
    except (OSError, http.client.HTTPException) as err:
        return f"GET {path} on port {port} failed: {type(err).__name__}: {err}"
    finally:
        connection.close()
    if not 200 <= response.status < 300:
        return f"GET {path} on port {port} answered {response.status}"
    return None
