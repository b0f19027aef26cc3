"""Request bodies for the router: read whole before the request takes a replica (an answer's
body is router_answer.py's).

A request's body is read (chunked ones decoded) into memory up to BODY_BUFFER before the router
takes a replica slot for it, so a client that trickles its body holds a connection, never a
replica; it goes upstream with a Content-Length, never chunked, so a replica that does not read
chunked bodies (Python's http.server) cannot take its chunks for a next request. A larger body
with a Content-Length is streamed after its first BODY_BUFFER bytes, under the request's
deadline; a larger chunked one is refused (413). Framing that two parsers could read two ways is
refused (400): Content-Length and Transfer-Encoding together, several Content-Length values, a
coding other than chunked, a malformed chunk, a body on GET or HEAD.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from gpupool.api.router_http import MAX_HEAD, BadMessage, Head, parse_head
from gpupool.api.router_limits import SEND_S

#: the most bytes of a request's body held before it takes a replica (chunked: in all)
BODY_BUFFER = 256 * 1024
#: the most bytes read at once while relaying a body
PIECE = 64 * 1024
#: methods whose body has no meaning (RFC 9110 9.3.1): a replica may answer without reading it
#: and take it for the next request on the connection
_BODILESS = frozenset({b"GET", b"HEAD", b"TRACE", b"CONNECT"})
_DIGITS = re.compile(rb"[0-9]{1,18}")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})(;[^\x00-\x08\x0a-\x1f\x7f]*)?\r\n")


@dataclass
class Body:
    """A request's body as read: `data`, and the bytes still to come after it (`left`, only for
    a Content-Length larger than BODY_BUFFER, to come by `deadline`, the event loop's time).
    `framed`: the request declared a body."""

    data: bytes = b""
    left: int = 0
    framed: bool = False
    deadline: float = 0.0

    @property
    def length(self) -> int:
        return len(self.data) + self.left


def request_length(head: Head) -> int | None:
    """The body's length by Content-Length; -1 for chunked; None for no body. BadMessage for
    framing a replica could read otherwise than the router."""
    codings = head.values(b"transfer-encoding")
    lengths = [v for k, v in head.headers if k.lower() == b"content-length"]
    if codings and lengths:
        raise BadMessage("a request may not have both Content-Length and Transfer-Encoding")
    if codings:
        if codings != [b"chunked"]:
            raise BadMessage("unsupported Transfer-Encoding: only chunked, once")
        if head.third != b"HTTP/1.1":
            raise BadMessage("Transfer-Encoding in an HTTP/1.0 request")
        length = -1
    elif lengths:
        if len(lengths) > 1 or not _DIGITS.fullmatch(lengths[0]):
            raise BadMessage("invalid Content-Length")
        length = int(lengths[0])
    else:
        return None
    if length and head.first in _BODILESS:
        raise BadMessage(f"a {head.first.decode()} request may not have a body")
    return length


async def read_request_body(reader: asyncio.StreamReader, length: int | None) -> Body:
    """The body as framed by `length` (request_length's): whole, or its first BODY_BUFFER
    bytes and how many are left."""
    if length is None:
        return Body()
    if length == -1:
        return Body(await _dechunk(reader), 0, True)
    data = await reader.readexactly(min(length, BODY_BUFFER))
    return Body(data, length - len(data), True)


async def _dechunk(reader: asyncio.StreamReader) -> bytes:
    data = bytearray()
    while size := await _chunk_size(reader):
        if len(data) + size > BODY_BUFFER:
            raise BadMessage(f"a chunked body larger than {BODY_BUFFER} bytes", 413)
        data += await reader.readexactly(size)
        await _crlf(reader)
    await _trailers(reader)
    return bytes(data)


async def _chunk_size(reader: asyncio.StreamReader) -> int:
    found = _CHUNK_SIZE.fullmatch(await _line(reader))
    if found is None:
        raise BadMessage("malformed chunk size line")
    return int(found.group(1), 16)


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError as err:
        raise BadMessage("a chunk line or trailer is too large") from err


async def _crlf(reader: asyncio.StreamReader) -> None:
    if await reader.readexactly(2) != b"\r\n":
        raise BadMessage("a chunk not followed by CRLF")


async def _trailers(reader: asyncio.StreamReader) -> None:
    """The trailer section up to its blank line, checked as a head's fields, and dropped (the
    request goes on with a Content-Length)."""
    lines = b""
    while (line := await _line(reader)) != b"\r\n":
        lines += line
        if len(lines) > MAX_HEAD:
            raise BadMessage("the trailers are too large")
    parse_head(b"POST / HTTP/1.1\r\n" + lines + b"\r\n")


async def relay_exactly(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int
) -> None:
    """Copy `length` bytes as they arrive; IncompleteReadError if the connection ends first."""
    while length:
        piece = await reader.read(min(length, PIECE))
        if not piece:
            raise asyncio.IncompleteReadError(b"", length)
        length -= len(piece)
        writer.write(piece)
        await sent(writer)


async def sent(writer: asyncio.StreamWriter) -> None:
    """Wait until what was written is taken in; TimeoutError (an OSError) if the other side
    takes in nothing for SEND_S: a client that stops reading its answer frees its replica."""
    async with asyncio.timeout(SEND_S):
        await writer.drain()
