"""HTTP/1.1 request heads for the router, parsed by llhttp (httptools) and checked strictly.

Only what a proxy must know is parsed: the start line and the headers. What a replica could read
otherwise than the router is refused rather than guessed at (RFC 9112 section 11): a bare CR or
LF, a folded header line (obs-fold), a header name that is not a token, a control character in a
value or the target, a request line that is not `METHOD TARGET HTTP/1.x`. A head longer than
MAX_HEAD or with more than MAX_HEADERS headers is refused with 431. Request bodies are in
router_body.py, replicas' answers in router_answer.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass

import httptools

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


class _HeadFound:
    """llhttp's callbacks for one request head."""

    def __init__(self) -> None:
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, data: bytes) -> None:
        self.target += data

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) == MAX_HEADERS:
            raise BadMessage(f"more than {MAX_HEADERS} header lines", 431)
        self.headers.append((name, value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        self.complete = True


def parse_head(data: bytes) -> Head:
    """A request head as read up to its blank line, parsed by llhttp (strict: no bare CR or LF,
    no folded line, header names tokens, no control character in a value or the target, one
    Content-Length, not with Transfer-Encoding); BadMessage for anything else, and for a start
    line other than `METHOD TARGET HTTP/1.0|1.1` with single spaces."""
    found = _HeadFound()
    parser = httptools.HttpRequestParser(found)
    try:
        parser.feed_data(data)
    except httptools.HttpParserUpgrade:
        pass  # an Upgrade head is whole; the router drops Upgrade and answers in HTTP/1.1
    except httptools.HttpParserCallbackError as err:
        refused = err.__context__  # what the callback raised: too many headers
        raise (refused if isinstance(refused, BadMessage) else BadMessage(str(err))) from None
    except httptools.HttpParserError as err:
        raise BadMessage(f"malformed head: {err}") from None
    version = b"HTTP/" + parser.get_http_version().encode()
    if not found.complete or version not in _VERSIONS:
        raise BadMessage("malformed request line")
    if data.partition(b"\r\n")[0].count(b" ") != 2:
        raise BadMessage("malformed request line")
    return Head(parser.get_method(), found.target, version, found.headers)


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
