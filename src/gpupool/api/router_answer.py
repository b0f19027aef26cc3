"""A replica's answer, parsed by llhttp (httptools, the parser uvicorn uses) as it comes, and
relayed to the client piece by piece.

llhttp frames the answer as the replica meant it, whatever the server: HTTP/1.0 or
`Connection: close` answers whose body ends with the connection, HTTP/1.1 keep-alive with a
Content-Length, chunked and server-sent-event streams (each piece passed on the moment it comes,
re-chunked), 1xx answers before the final one. It refuses what two parsers could read two ways
(Content-Length with Transfer-Encoding, several lengths, a malformed chunk): such an answer is a
failed request. A connection goes back to the pool only when llhttp says the answer keeps it
alive, the answer was read to its end and nothing more came after it.
"""

from __future__ import annotations

import asyncio

import httptools

from gpupool.api.router_body import PIECE, sent
from gpupool.api.router_http import BadMessage, Head

#: statuses whose answers never have a body (RFC 9110 6.4.1)
_BODILESS = (204, 304)


class Answer:
    """One exchange's answer on an upstream connection: `head()`, then `relay()`."""

    def __init__(self, reader: asyncio.StreamReader, head_only: bool) -> None:
        self._reader = reader
        #: the request was a HEAD: the answer ends with its head, whatever it says
        self._head_only = head_only
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._reason = b""
        self._informational: list[Head] = []
        self._final: Head | None = None
        self._pieces: list[bytes] = []
        self._trailers: list[tuple[bytes, bytes]] = []
        self._keep_alive = False
        #: the final answer was read to its end; more bytes came after it (never reused)
        self.complete = False
        self.extra = False
        #: bytes of the answer received so far (none: the replica never began to answer)
        self.received = 0

    # -- llhttp's callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.extra = self.extra or self.complete
        self._headers, self._reason = [], b""

    def on_status(self, data: bytes) -> None:
        self._reason += data

    def on_header(self, name: bytes, value: bytes) -> None:
        (self._headers if self._final is None else self._trailers).append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        # passed on in the router's own version, whatever the replica's (RFC 9110 6.2)
        head = Head(b"HTTP/1.1", str(status).encode(), self._reason, self._headers)
        if 100 <= status < 200:
            self._informational.append(head)
        elif self._final is None:
            self._final = head
            # asked now: once the answer is complete llhttp has forgotten its framing
            self._keep_alive = self._parser.should_keep_alive()
            if self._head_only or status in _BODILESS:
                self.complete = True

    def on_body(self, data: bytes) -> None:
        if self.complete:  # a HEAD answer's "body": bytes no one asked for
            self.extra = True
        else:
            self._pieces.append(data)

    def on_message_complete(self) -> None:
        if self._final is not None:
            self.complete = True

    # -- reading ---------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise BadMessage("the replica switched protocols") from None
        except httptools.HttpParserError as err:
            if not self.complete:
                raise BadMessage(f"a malformed answer: {err}") from None
            self.extra = True  # after a whole answer: never reused, the answer stands

    async def head(self, client: asyncio.StreamWriter) -> Head | None:
        """The final answer's head (1xx ones passed on to `client` as they come); None when
        the connection ended before any byte; BadMessage when it ended inside the head."""
        while self._final is None:
            data = await self._reader.read(PIECE)
            if not data:
                if self.received:
                    raise BadMessage("the connection ended inside the answer's head")
                return None
            self._feed(data)
            for informational in self._informational:  # 102, 103 and the like
                client.write(informational.encode())
            self._informational.clear()
        return self._final

    @property
    def chunked(self) -> bool:
        final = self._final
        return final is not None and final.values(b"transfer-encoding")[-1:] == [b"chunked"]

    @property
    def framed(self) -> bool:
        """The answer's end is told by its framing, not by the connection's."""
        final = self._final
        if final is None or self.complete:
            return True
        return self.chunked or final.get(b"content-length") is not None

    @property
    def reusable(self) -> bool:
        """The connection may carry a next request: the answer ended cleanly framed, kept
        alive, with nothing after it."""
        return self.complete and not self.extra and self._keep_alive

    async def relay(self, client: asyncio.StreamWriter) -> None:
        """Copy the body to `client` as it comes (re-chunked if chunked); IncompleteReadError
        if the connection ends before a framed body does."""
        chunked = self.chunked
        self._flush(client, chunked)
        while not self.complete:
            await sent(client)
            data = await self._reader.read(PIECE)
            if not data:
                if self.framed:
                    raise asyncio.IncompleteReadError(b"", None)
                self.complete = True  # an answer that ends with its connection
                break
            self._feed(data)
            self._flush(client, chunked)
        if chunked:
            trailers = b"".join(k + b": " + v + b"\r\n" for k, v in self._trailers)
            client.write(b"0\r\n" + trailers + b"\r\n")
        await sent(client)

    def _flush(self, client: asyncio.StreamWriter, chunked: bool) -> None:
        for piece in self._pieces:
            if chunked:
                client.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            else:
                client.write(piece)
        self._pieces.clear()
