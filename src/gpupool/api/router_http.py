"""HTTP/1.1 heads for the router: request and response heads, read and checked strictly.

Only what a proxy must know is parsed: the start line and the headers. What a replica could read
otherwise than the router is refused rather than guessed at (RFC 9112 section 11): a bare CR or
LF, a folded header line (obs-fold), a header name that is not a token, a control character in a
value, a request line that is not `METHOD TARGET HTTP/1.x`. A head longer than MAX_HEAD or with
more than MAX_HEADERS headers is refused with 431. Bodies are in router_body.py.
"""

from __future__ import annotations

import asyncio
import json
import re
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
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: a control character other than a tab (DEL included): never valid in a field value or target
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_VERSIONS = (b"HTTP/1.1", b"HTTP/1.0")


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


def parse_head(data: bytes) -> Head:
    """A head as read up to its blank line; BadMessage for anything but plain lines."""
    lines = data[:-4].split(b"\r\n")
    if any(b"\r" in line or b"\n" in line for line in lines):
        raise BadMessage("a bare CR or LF in the head")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadMessage(f"more than {MAX_HEADERS} header lines", 431)
    words = lines[0].split(b" ", 2)
    if len(words) != 3:
        raise BadMessage("malformed start line")
    return Head(words[0], words[1], words[2], [_field(line) for line in lines[1:]])


def _field(line: bytes) -> tuple[bytes, bytes]:
    if line[:1] in (b" ", b"\t"):
        raise BadMessage("a folded header line (obs-fold)")
    name, sep, value = line.partition(b":")
    if not sep or not _TOKEN.fullmatch(name):
        raise BadMessage("malformed header line")
    value = value.strip(b" \t")
    if _CONTROL.search(value):
        raise BadMessage("a control character in a header value")
    return name, value


def check_request_line(head: Head) -> None:
    """BadMessage unless the start line is `METHOD TARGET HTTP/1.0|1.1`."""
    if not _TOKEN.fullmatch(head.first) or head.third not in _VERSIONS:
        raise BadMessage("malformed request line")
    if not head.second or _CONTROL.search(head.second) or b" " in head.second:
        raise BadMessage("malformed request target")


async def read_head(reader: asyncio.StreamReader) -> Head | None:
    """The next head on `reader`; None at a clean end of the connection."""
    try:
        data = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as err:
        if not err.partial.strip():
            return None
        raise BadMessage("the connection ended inside a head") from err
    except asyncio.LimitOverrunError as err:
        raise BadMessage("the head is too large", 431) from err
    return parse_head(data.lstrip(b"\r\n"))


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
