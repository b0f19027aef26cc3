"""The router's side towards replicas: kept-alive connections, each checked to be the service
owner's, and one request's exchange, its answer copied back as it arrives.

An upstream connection goes back to the pool only when its exchange ended cleanly framed, as
llhttp read it (router_answer.py): an answer that keeps the connection alive, read to its end,
with nothing more after it. Anything else (an HTTP/1.0 answer, one that ends with the
connection, a replica that sent more than it was asked for) closes it, so a next request, maybe
another client's, never reads what was meant for this one. A request that never reached the
replica (a kept-alive connection it had closed, one it reset unread) is UpstreamRefused: the
router sends it to another replica.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from dataclasses import dataclass
from typing import NamedTuple

from gpupool.agent.service_traffic import Endpoint
from gpupool.api.router_answer import Answer
from gpupool.api.router_body import Body
from gpupool.api.router_http import MAX_HEAD, BadMessage, Head
from gpupool.isolation.sock_owner import PeerUnknown, accepting_uid

#: idle connections kept per replica
POOL_SIZE = 64
#: times the owner of a new connection's other end is asked (the kernel may still be completing
#: the handshake on the replica's side), a millisecond apart
OWNER_TRIES = 3
#: request headers the router sets itself: the body goes with a Content-Length of its own, and
#: `Expect: 100-continue` was answered by the router
_REFRAMED = frozenset({b"content-length", b"transfer-encoding", b"expect"})

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Client(NamedTuple):
    """A client's connection: `lost` is done once it is gone (reset; not at a half-close, after
    which the client still reads its answer)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    lost: asyncio.Future[None]


class UpstreamFailed(Exception):
    """The replica failed before its answer began: the client gets a 502."""


class ClientGone(ConnectionResetError):
    """The client's connection was lost before its answer began: the replica's request was cut
    (its connection closed), its slot freed; nothing is counted."""


class UpstreamRefused(UpstreamFailed):
    """The request never reached the replica: the connection was refused (or its listener was
    not the owner's), or the replica closed it with the request unread (a kept-alive connection
    it closed as idle just as the request was sent, a connection still in its listen queue when
    it stopped). Sent again to a ready replica, never answered 502."""


@dataclass
class Request:
    """A client's request as the router received it, head and body (or the body's start)."""

    head: Head
    body: Body
    name: bytes
    path: bytes
    forwarded: bytes

    def encode(self) -> bytes:
        """What goes upstream first: the head, its path `path`, framed by Content-Length."""
        extra = [(b"X-Forwarded-For", self.forwarded)]
        if self.name:  # a /NAME path's; an OpenAI API request goes with its path unchanged
            extra.append((b"X-Forwarded-Prefix", b"/" + self.name))
        if self.body.framed:
            extra.append((b"Content-Length", str(self.body.length).encode()))
        head = Head(self.head.first, self.path, b"HTTP/1.1", self.head.headers)
        return head.encode(extra, drop=_REFRAMED) + self.body.data


class Upstreams:
    """Connections to the replicas, kept alive by port (the router's event loop only)."""

    def __init__(self) -> None:
        self._pools: dict[int, list[Connection]] = {}

    def keep_only(self, live: set[int]) -> None:
        """Close the kept connections to ports no longer published (stopped, failed)."""
        for port in [port for port in self._pools if port not in live]:
            for _, writer in self._pools.pop(port):
                writer.close()

    async def connect(self, endpoint: Endpoint, owner: int) -> tuple[Connection, bool]:
        """A kept-alive connection to `endpoint` (one the replica closed, or sent something
        unasked on, is dropped), or a new one whose other end `owner` holds; and whether it
        was kept-alive."""
        pool = self._pools.setdefault(endpoint.port, [])
        while pool:
            reader, writer = pool.pop()
            if not reader.at_eof() and not writer.is_closing() and not _unread(reader):
                return (reader, writer), True
            writer.close()
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", endpoint.port, limit=MAX_HEAD
            )
        except OSError as err:
            endpoint.refused()
            raise UpstreamRefused(f"the replica on port {endpoint.port} refused: {err}") from err
        why = await _not_owners(writer.get_extra_info("socket"), owner)
        if why is not None:
            writer.close()
            endpoint.refused()
            raise UpstreamRefused(f"port {endpoint.port}: {why}")
        return (reader, writer), False

    async def forward(
        self, request: Request, endpoint: Endpoint, owner: int, client: Client, keep: bool
    ) -> tuple[int, bool]:
        """Send `request` to `endpoint`, copy its answer back; (status, whether the client
        connection may stay open). UpstreamFailed when the replica fails before its answer
        began; BadMessage (408) when the client's streamed body does not come in time;
        ClientGone when the client's connection is lost before then."""
        writer = client.writer
        if client.lost.done():
            raise ClientGone("the client went before its request took a replica")
        (up_reader, up_writer), reused = await self.connect(endpoint, owner)
        answer = Answer(up_reader, head_only=request.head.first == b"HEAD")

        def cut(_: object) -> None:  # the replica sees its request's connection reset
            up_writer.transport.abort()

        client.lost.add_done_callback(cut)
        try:
            head = await _exchange(request, endpoint, answer, up_writer, writer)
        except UpstreamFailed as err:
            if client.lost.done():  # cut() closed the connection: no replica's failure
                raise ClientGone(f"the client went before its answer began: {err}") from err
            unread = not request.body.left and _unread_by_replica(answer, up_writer, err, reused)
            up_writer.close()
            if not unread:
                raise
            raise UpstreamRefused(f"replica on port {endpoint.port} took nothing: {err}") from err
        finally:
            client.lost.remove_done_callback(cut)
        # an answer that ends with its connection ends the client's too
        client_keep = keep and answer.framed
        extra = [] if client_keep else [(b"Connection", b"close")]
        writer.write(head.encode(extra))
        try:
            await answer.relay(writer)
        except (OSError, asyncio.IncompleteReadError, BadMessage):
            # cut mid-answer: the client sees the connection end, counted as a 502
            up_writer.close()
            raise ConnectionResetError("the answer was cut") from None
        pool = self._pools.setdefault(endpoint.port, [])
        if answer.reusable and not _unread(up_reader) and len(pool) < POOL_SIZE:
            pool.append((up_reader, up_writer))
        else:
            up_writer.close()
        return int(head.second), client_keep


async def _exchange(
    request: Request,
    endpoint: Endpoint,
    answer: Answer,
    up_writer: asyncio.StreamWriter,
    writer: asyncio.StreamWriter,
) -> Head:
    """Send the request (its head and body; the rest of a streamed body by its deadline) and
    read the answer's head (1xx ones passed on to the client's `writer`); UpstreamFailed when
    the replica fails first."""
    try:
        up_writer.write(request.encode())
        if request.body.left and request.body.source is not None:
            try:
                async with asyncio.timeout_at(request.body.deadline):
                    await request.body.source.relay_rest(up_writer)
            except TimeoutError:
                up_writer.close()
                raise BadMessage("the body did not come in time", 408) from None
        head = await answer.head(writer)
    except (OSError, asyncio.IncompleteReadError, BadMessage) as err:
        if isinstance(err, BadMessage) and err.status == 408:
            raise
        raise UpstreamFailed(f"replica on port {endpoint.port} failed: {err}") from err
    if head is None:
        raise UpstreamFailed(f"replica on port {endpoint.port} closed the connection")
    return head


def _unread_by_replica(
    answer: Answer, writer: asyncio.StreamWriter, err: UpstreamFailed, reused: bool
) -> bool:
    """Whether the replica closed the connection without reading the request: no byte of an
    answer came, and the connection was reset (a kernel resets a connection closed with data
    unread, or still in a listen queue when its listener closed) rather than ended after the
    request was read, which is how a replica that took the request and died ends it."""
    if answer.received:
        return False
    cause = err.__cause__
    if isinstance(cause, (ConnectionResetError, BrokenPipeError)):
        return True
    if cause is not None or not reused:
        return False
    # a kept-alive connection's end came with no answer: the replica closed it as idle (its
    # end crossed the request) if the request was then reset, not read
    sock = writer.get_extra_info("socket")
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if sock is not None else 0
    return code in (errno.ECONNRESET, errno.EPIPE)


async def _not_owners(sock: socket.socket, owner: int) -> str | None:
    """Why the other end of `sock` is not `owner`'s listener's; None when it is."""
    why = "no answer"
    for attempt in range(OWNER_TRIES):
        if attempt:
            await asyncio.sleep(0.001)
        try:
            uid = accepting_uid(sock)
        except (PeerUnknown, OSError) as err:
            why = f"cannot tell whose listener took the connection: {err}"
            continue
        if uid == owner:
            return None
        return f"the listener belongs to uid {uid}, not to the service's owner (uid {owner})"
    return why


def _unread(reader: asyncio.StreamReader) -> int:
    """Bytes a connection has received that no exchange asked for (StreamReader has no public
    way to tell: its buffer is read as asyncio's own code reads it)."""
    return len(getattr(reader, "_buffer", b""))
