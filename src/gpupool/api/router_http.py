"""HTTP/1.1 framing for the router: request and response heads, and bodies relayed as they come.

Only what a proxy must know is parsed: the start line, the headers, and where a message's body
ends (Content-Length, chunked, or the connection's end). A body is copied piece by piece as it
arrives, chunk framing included, so a token stream's bytes are passed on the moment they come.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass

#: the largest request or response head accepted (the StreamReader's limit)
MAX_HEAD = 64 * 1024
#: the most bytes read at once while relaying a body
PIECE = 64 * 1024
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

    def tokens(self, name: bytes) -> set[bytes]:
        """The comma-separated tokens of every `name` header, lower-cased."""
        found: set[bytes] = set()
        for key, value in self.headers:
            if key.lower() == name:
                found.update(t.strip().lower() for t in value.split(b","))
        return found

    @property
    def chunked(self) -> bool:
        return b"chunked" in self.tokens(b"transfer-encoding")

    def length(self) -> int | None:
        """The Content-Length, or None; BadMessage for a bad or conflicting one."""
        values = {v.strip() for k, v in self.headers if k.lower() == b"content-length"}
        if not values:
            return None
        if len(values) > 1 or not next(iter(values)).isdigit():
            raise BadMessage("invalid Content-Length")
        return int(next(iter(values)))

    def encode(self, extra: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
        """The head to pass on: hop-by-hop headers dropped, `extra` added."""
        lines = [b" ".join((self.first, self.second, self.third))]
        lines += [k + b": " + v for k, v in self.headers if k.lower() not in HOP_BY_HOP]
        lines += [k + b": " + v for k, v in extra]
        return b"\r\n".join(lines) + b"\r\n\r\n"


def parse_head(data: bytes) -> Head:
    """A head as read up to its blank line."""
    lines = data[:-4].split(b"\r\n")
    words = lines[0].split(b" ", 2)
    if len(words) != 3:
        raise BadMessage("malformed start line")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name:
            raise BadMessage("malformed header line")
        headers.append((name, value.strip()))
    return Head(words[0], words[1], words[2], headers)


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


async def relay_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    head: Head,
    until_close: bool = False,
) -> None:
    """Copy the body that follows `head` from `reader` to `writer` as it arrives: chunked as
    chunked (framing and all), Content-Length bytes, or (`until_close`, a response without
    either) everything until the connection ends."""
    if head.chunked:
        await _relay_chunked(reader, writer)
        return
    length = head.length()
    if length is None:
        if not until_close:
            return
        while piece := await reader.read(PIECE):
            writer.write(piece)
            await writer.drain()
        return
    while length:
        piece = await reader.read(min(length, PIECE))
        if not piece:
            raise asyncio.IncompleteReadError(b"", length)
        length -= len(piece)
        writer.write(piece)
        await writer.drain()


async def _relay_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadMessage("malformed chunk size") from None
        writer.write(line)
        if size == 0:  # the trailer section, up to its blank line
            while True:
                trailer = await reader.readuntil(b"\r\n")
                writer.write(trailer)
                if trailer == b"\r\n":
                    await writer.drain()
                    return
        left = size + 2  # the chunk and its CRLF
        while left:
            piece = await reader.read(min(left, PIECE))
            if not piece:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(piece)
            writer.write(piece)
        await writer.drain()


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
