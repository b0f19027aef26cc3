"""A client connection's requests, framed by llhttp (httptools, the parser uvicorn uses): one
parser per connection, fed as bytes arrive; a replica's answers are router_answer.py's.

The parser reads no more than one piece (PIECE) past the request being served: what it framed
of the next pipelined requests waits in order for its turn. A request's body is read (chunked
ones decoded) into memory up to BODY_BUFFER before the router takes a replica slot for it, so a
client that trickles its body holds a connection, never a replica; it goes upstream with a
Content-Length, never chunked, so a replica that does not read chunked bodies (Python's
http.server) cannot take its chunks for a next request. A larger body with a Content-Length is
streamed after its first BODY_BUFFER bytes, under the request's deadline; a larger chunked one
is refused (413). Refused too, on top of what llhttp refuses (a bare CR or LF, a folded header
line, a header name that is not a token, a control character, a malformed chunk), is framing
that two parsers could read two ways (400): Content-Length and Transfer-Encoding together,
several Content-Length values, a coding other than chunked, Transfer-Encoding in HTTP/1.0, a
body on GET or HEAD, a version other than HTTP/1.0 and 1.1. A head over MAX_HEAD bytes or with
more than MAX_HEADERS headers gets 431.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from dataclasses import dataclass, field

import httptools

from gpupool.api.router_http import MAX_HEAD, MAX_HEADERS, BadMessage, Head
from gpupool.api.router_limits import SEND_S

#: the most bytes of a request's body held before it takes a replica (chunked: in all)
BODY_BUFFER = 256 * 1024
#: the most bytes read at once from a connection
PIECE = 64 * 1024
#: the most bytes a chunked request may take on the wire, its framing and trailers with its data
CHUNKED_WIRE = MAX_HEAD + 2 * BODY_BUFFER
#: methods whose body has no meaning (RFC 9110 9.3.1): a replica may answer without reading it
#: and take it for the next request on the connection
_BODILESS = frozenset({b"GET", b"HEAD", b"TRACE", b"CONNECT"})
_DIGITS = re.compile(rb"[0-9]{1,18}")
_VERSIONS = {"1.1": b"HTTP/1.1", "1.0": b"HTTP/1.0"}


@dataclass
class Body:
    """A request's body as read: `data`, and the bytes still to come after it (`left`, only for
    a Content-Length larger than BODY_BUFFER, to come by `deadline`, the event loop's time, from
    `source`). `framed`: the request declared a body."""

    data: bytes = b""
    left: int = 0
    framed: bool = False
    deadline: float = 0.0
    source: Requests | None = field(default=None, repr=False)

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


class _Message:
    """One request as llhttp frames it: its head once whole, its body's pieces not yet taken."""

    __slots__ = (
        "complete",
        "head",
        "headers",
        "held",
        "length",
        "pieces",
        "size",
        "target",
        "trailers",
    )

    def __init__(self) -> None:
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: Head | None = None
        self.length: int | None = None
        self.pieces: list[bytes] = []
        self.held = 0
        self.trailers = 0
        self.size = 0  # the head's bytes so far, its target and headers
        self.complete = False


class Requests:
    """The requests of one client connection, in order: `head()`, then `body()`, then, for a
    body larger than BODY_BUFFER, `relay_rest()`."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self._parser = httptools.HttpRequestParser(self)
        self._messages: deque[_Message] = deque()
        #: why the parser stopped (raised when the request it stopped in is asked for)
        self._failed: BadMessage | None = None
        #: the connection ended, or switched protocols: nothing more is parsed
        self._ended = False
        #: bytes read since a request was last complete: what a head or a chunked body took
        self._wire = 0

    # -- llhttp's callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._messages.append(_Message())

    def on_url(self, data: bytes) -> None:
        message = self._messages[-1]
        message.target += data
        message.size += len(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self._messages[-1]
        if message.head is not None:  # a trailer: checked by llhttp as a header, dropped
            message.trailers += 1
            if message.trailers > MAX_HEADERS:
                raise BadMessage(f"more than {MAX_HEADERS} trailers")
        elif len(message.headers) == MAX_HEADERS:
            raise BadMessage(f"more than {MAX_HEADERS} header lines", 431)
        else:
            message.headers.append((name, value.rstrip(b" \t")))
            message.size += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        message = self._messages[-1]
        version = _VERSIONS.get(self._parser.get_http_version())
        if version is None:
            raise BadMessage("malformed request line: only HTTP/1.0 and HTTP/1.1")
        if message.size > MAX_HEAD:  # a head that came in one piece, which _bound did not see
            raise BadMessage("the head is too large", 431)
        head = Head(self._parser.get_method(), message.target, version, message.headers)
        message.length = request_length(head)
        message.head = head

    def on_body(self, data: bytes) -> None:
        message = self._messages[-1]
        message.pieces.append(data)
        message.held += len(data)
        if message.length == -1 and message.held > BODY_BUFFER:
            raise BadMessage(f"a chunked body larger than {BODY_BUFFER} bytes", 413)

    def on_message_complete(self) -> None:
        self._messages[-1].complete = True
        self._wire = 0

    # -- reading ---------------------------------------------------------------------------

    async def _more(self) -> bool:
        """Read a piece and parse it; False at the end of the connection, BadMessage if the
        parser stopped in the request being read."""
        if self._failed is not None:
            raise self._failed
        if self._ended:
            return False
        data = await self.reader.read(PIECE)
        if not data:
            self._ended = True
            return False
        self._wire += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._ended = True  # the router switches no protocol: the connection ends after it
        except httptools.HttpParserCallbackError as err:
            refused = err.__context__  # what a callback raised
            self._failed = refused if isinstance(refused, BadMessage) else BadMessage(str(err))
        except httptools.HttpParserError as err:
            self._failed = BadMessage(f"malformed request: {err}")
        if self._wire > MAX_HEAD:  # both bounds are past it (CHUNKED_WIRE > MAX_HEAD)
            self._bound()
        return True

    def _bound(self) -> None:
        """A head over MAX_HEAD bytes, or a chunked body over CHUNKED_WIRE on the wire, stops
        the parser (llhttp buffers nothing, but httptools gathers a header line's pieces)."""
        if self._failed is not None:
            return
        last = self._messages[-1] if self._messages else None
        if last is None or last.complete or last.head is None:  # between requests, or a head
            if self._wire > MAX_HEAD:
                self._failed = BadMessage("the head is too large", 431)
        elif last.length == -1 and self._wire > CHUNKED_WIRE:
            self._failed = BadMessage(f"a chunked body larger than {BODY_BUFFER} bytes", 413)

    async def head(self) -> Head | None:
        """The next request's head; None at a clean end of the connection."""
        while not self._messages or self._messages[0].head is None:
            if not await self._more():
                if self._messages:
                    raise BadMessage("the connection ended inside a head")
                return None
        return self._messages[0].head

    def declares_body(self) -> bool:
        """Whether the request whose head came last declares a body (chunked, or a length)."""
        return bool(self._messages[0].length)

    async def body(self) -> Body:
        """The body of the request whose head came last: whole, or its first BODY_BUFFER bytes
        and how many are left (for `relay_rest`)."""
        message = self._messages[0]
        if message.complete and not message.pieces:  # no body, or an empty one
            self._messages.popleft()
            return Body(b"", 0, message.length is not None, source=self)
        # a chunked body is read whole (on_body refuses it past BODY_BUFFER)
        while not message.complete and (message.length == -1 or message.held < BODY_BUFFER):
            if not await self._more():
                raise asyncio.IncompleteReadError(b"", None)
        data = b"".join(message.pieces)
        message.pieces, message.held = [], 0
        if len(data) > BODY_BUFFER:  # the rest goes on with relay_rest, after a replica is found
            message.pieces, data = [data[BODY_BUFFER:]], data[:BODY_BUFFER]
        length = message.length  # None: no body; -1: chunked, here whole
        left = length - len(data) if length is not None and length > 0 else 0
        if not left:
            self._messages.popleft()
        return Body(data, left, message.length is not None, source=self)

    async def relay_rest(self, writer: asyncio.StreamWriter) -> None:
        """The rest of that body copied to `writer` as it comes; IncompleteReadError if the
        connection ends first."""
        message = self._messages[0]
        while True:
            for piece in message.pieces:
                writer.write(piece)
            message.pieces, message.held = [], 0
            await sent(writer)
            if message.complete:
                self._messages.popleft()
                return
            if not await self._more():
                raise asyncio.IncompleteReadError(b"", None)


async def sent(writer: asyncio.StreamWriter) -> None:
    """Wait until what was written is taken in; TimeoutError (an OSError) if the other side
    takes in nothing for SEND_S: a client that stops reading its answer frees its replica."""
    async with asyncio.timeout(SEND_S):
        await writer.drain()
