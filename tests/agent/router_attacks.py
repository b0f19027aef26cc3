"""Raw HTTP for the router's attack tests: requests as an attacker writes them, byte for byte,
and their answers read as they come."""

from __future__ import annotations

import json
import socket
import time
from typing import Any


def raw(port: int, data: bytes, timeout: float = 10) -> bytes:
    """Send `data` on a new connection to the router, half-close, read until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0


def json_body(answer: bytes) -> dict[str, Any]:
    """The first answer's JSON body (by its Content-Length)."""
    head, _, rest = answer.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    found: dict[str, Any] = json.loads(rest[:length])
    return found


def trickle(port: int, head: bytes) -> socket.socket:
    """A connection that sent `head` and one byte of its body, and sends no more."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head + b"x")
    time.sleep(0.01)
    return sock
