"""HTTP/1.1 for the router: heads as llhttp (httptools) parsed them, re-encoded to be passed on,
and the answers the router makes itself. Clients' requests are framed in router_body.py,
replicas' answers in router_answer.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

#: the largest request or response head accepted (the StreamReader's limit)
MAX_HEAD = 64 * 1024
#: the most header lines one head may have
MAX_HEADERS = 100
#: headers of one hop (RFC 9110 7.6.1), never passed on
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


class BadMessage(Exception):
    """A malformed head or body framing; `status` is the answer for a client's request."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Head:
    """A request or response head: the start line's three words, and the headers as sent."""

    first: bytes
    second: bytes
    third: bytes
    headers: list[tuple[bytes, bytes]]

    def get(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def values(self, name: bytes) -> list[bytes]:
        """Every `name` header's comma-separated values, lower-cased, in order (empty ones too)."""
        found: list[bytes] = []
        for key, value in self.headers:
            if key.lower() == name:
                found += [t.strip(b" \t").lower() for t in value.split(b",")]
        return found

    def tokens(self, name: bytes) -> set[bytes]:
        """The comma-separated tokens of every `name` header, lower-cased."""
        return set(self.values(name))

    def encode(
        self, extra: Sequence[tuple[bytes, bytes]] = (), drop: frozenset[bytes] = frozenset()
    ) -> bytes:
        """The head to pass on: hop-by-hop headers and those named in `drop` left out, `extra`
        added."""
        left_out = HOP_BY_HOP | drop
        lines = [b" ".join((self.first, self.second, self.third))]
        lines += [k + b": " + v for k, v in self.headers if k.lower() not in left_out]
        lines += [k + b": " + v for k, v in extra]
        return b"\r\n".join(lines) + b"\r\n\r\n"


#: the reason phrase of each status the router answers itself
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


def json_answer(
    status: int,
    reason: str,
    error: str,
    message: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> bytes:
    """A whole response with a JSON body `{"error", "message"}`, as the daemon's API answers."""
    body = json.dumps({"error": error, "message": message}).encode()
    lines = [f"HTTP/1.1 {status} {reason}".encode(), b"Content-Type: application/json"]
    lines.append(b"Content-Length: " + str(len(body)).encode())
    lines += [k + b": " + v for k, v in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
