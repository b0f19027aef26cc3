"""The router (`gpupool serve --router HOST:PORT`): /NAME/... to a ready replica of NAME.

A reverse proxy on asyncio streams and uvloop, in a process of its own that outlives the daemon
(router_proc.py; docs/inference.md says why this over aiohttp or uvicorn with httpx: it was
measured). Each
request goes, its `/NAME` prefix stripped, to the replica of NAME with the fewest requests in
flight that is below the service's concurrency; the answer is copied back as it arrives (a
token stream's first byte is never held). With no such replica the request waits in a bounded
queue while the autoscaler adds one (a wake from zero too); past the queue's bound, or after
WAIT_S, it gets 503 with Retry-After. A request that never reached a replica (a refused
connection, a kept-alive connection the replica had closed, one it reset unread as it stopped)
goes to another ready replica, or waits for one; only a replica that took a request and then
failed gets it a 502 (or, once the answer has begun, a cut connection), counted like every other
answer. Connections to replicas are kept alive and reused (router_upstream.py).

A request takes a replica slot only once its head and body are in (router_body.py), so a client
that trickles them holds a connection of its own, never a replica; how many connections, and for
how long, is bounded by router_limits.py.

`/v1/...` is the OpenAI API's (router_openai.py): a request there goes, its path unchanged, to
the service that answers for its body's `model`, with the same choice, queue and streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import uvloop

from gpupool.agent.service_traffic import Endpoint, ServiceTraffic, Traffic
from gpupool.api import router_openai as openai
from gpupool.api.router_body import PIECE, Body, Requests
from gpupool.api.router_http import MAX_HEAD, REASONS, BadMessage, Head, json_answer
from gpupool.api.router_limits import BODY_S, HEAD_S, Connections
from gpupool.api.router_upstream import (
    Client,
    ClientGone,
    Request,
    UpstreamFailed,
    UpstreamRefused,
    Upstreams,
)

#: requests one service may have waiting for a replica; more get 503 at once
QUEUE_LIMIT = 256
#: seconds a request waits for a replica (a cold start included) before 503
WAIT_S = 60.0
#: seconds between tries of a request that reached no replica, times the tries so far
UNREACHED_PAUSE_S = 0.01
#: seconds the router waits for requests in flight when it stops
STOP_GRACE_S = 10.0
#: seconds a refused request's connection is read (and what comes dropped) before it closes
LINGER_S = 1.0
_RETRY = [(b"Retry-After", b"1")]
#: the `error` of a /NAME path's error answers, by status (others: BadRequest)
_ERRORS = {404: "NotFound", 502: "BadGateway", 503: "Unavailable"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: how an error answer is written: a /NAME path's (`_native`) or OpenAI's (router_openai.py)
Shape = Callable[..., bytes]


class Router:
    """The proxy over one listening socket; `run()` serves on the calling thread."""

    def __init__(self, traffic: Traffic, sock: socket.socket) -> None:
        self.traffic = traffic
        self.sock = sock
        self.loop = uvloop.new_event_loop()
        self._upstreams = Upstreams()
        self._connections = Connections()
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self._server: asyncio.Server | None = None
        #: set once the router has a table (router_proc.py): before, a request for a service it
        #: does not know waits for one rather than getting 404
        self.known = asyncio.Event()
        #: the endpoints with requests in flight (one may have left the table: it drains)
        self.busy: set[Endpoint] = set()
        self._active = 0

    # -- lifecycle -------------------------------------------------------------------------

    def run(self, until: Callable[[], Awaitable[None]]) -> None:
        """Serve on this thread until `until()` returns (router_proc.py's control channel
        decides when), then stop: the requests in flight finish first (STOP_GRACE_S)."""
        asyncio.set_event_loop(self.loop)
        self.traffic.on_change = self._wake_all
        self._server = self.loop.run_until_complete(
            asyncio.start_server(self._client, sock=self.sock, limit=MAX_HEAD)
        )
        try:
            self.loop.run_until_complete(until())
            self.loop.run_until_complete(self.shutdown())
        finally:
            self.traffic.on_change = None
            self.loop.close()

    def close(self) -> None:
        """Stop taking connections (those open go on)."""
        if self._server is not None:
            self._server.close()

    async def shutdown(self) -> None:
        """Stop taking connections, let the requests in flight finish (STOP_GRACE_S)."""
        self.close()
        deadline = time.monotonic() + STOP_GRACE_S
        while self._active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    # -- waiting for a replica -------------------------------------------------------------

    def _wake_all(self) -> None:
        """The endpoints changed: every waiter looks again; connections to replicas no longer
        published (stopped, failed) are closed."""
        self._upstreams.keep_only({e.port for s in self.traffic.all() for e in s.endpoints})
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def _wake_one(self, name: str) -> None:
        for future in self._waiters.get(name, ()):
            if not future.done():
                future.set_result(None)
                return

    @staticmethod
    def _pick(service: ServiceTraffic) -> Endpoint | None:
        best = None
        for endpoint in service.endpoints:
            if endpoint.draining or endpoint.broken or endpoint.in_flight >= service.concurrency:
                continue
            if best is None or endpoint.in_flight < best.in_flight:
                best = endpoint
        return best

    async def _endpoint(self, service: ServiceTraffic) -> Endpoint | str:
        """A replica with room, waiting for one if need be; or why there is none."""
        waiters = self._waiters.setdefault(service.name, deque())
        endpoint = None if waiters else self._pick(service)
        if endpoint is not None:
            return endpoint
        if service.queued >= QUEUE_LIMIT:
            return f"{QUEUE_LIMIT} requests already wait for a replica of {service.name}"
        service.queued += 1
        self.traffic.waiting(service.name)
        deadline = time.monotonic() + WAIT_S
        try:
            while not service.gone:
                future: asyncio.Future[None] = self.loop.create_future()
                waiters.append(future)
                try:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(future, left)
                finally:
                    waiters.remove(future)
                endpoint = self._pick(service)
                if endpoint is not None:
                    return endpoint
        finally:
            service.queued -= 1
        if service.gone:
            return "gone"
        return f"no replica of {service.name} was free within {WAIT_S:g}s"

    # -- one client connection -------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:  # asyncio sets it on connections it makes, not on accepted ones:
            # without it a head and a body written apart wait out the client's delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = writer.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) else "local"
        refused = self._connections.admit(address)
        if refused is not None:
            writer.write(_native(503, refused, close=True, extra=_RETRY))
            writer.close()
            return
        # done when the connection is lost (a reset), to cut the request it has at a replica
        lost = self.loop.create_task(writer.wait_closed())
        lost.add_done_callback(_seen)
        try:
            await self._serve(Client(reader, writer, lost), address.encode())
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went, or sent no whole head in time: its connection ends
        except BadMessage as err:
            writer.write(_native(err.status, str(err), close=True))
            await _linger(reader, writer)
        finally:
            self._connections.release(address)
            with contextlib.suppress(Exception):
                writer.close()
            lost.cancel()

    async def _serve(self, client: Client, forwarded: bytes) -> None:
        """Requests on one connection, one after the other, until one ends it."""
        reader, writer, _ = client
        requests = Requests(reader)
        while True:
            async with asyncio.timeout(HEAD_S):  # the idle time and the head's in one
                head = await requests.head()
            if head is None:
                return
            expect = head.third == b"HTTP/1.1" and b"100-continue" in head.tokens(b"expect")
            if expect and requests.declares_body():
                writer.write(_CONTINUE)
            try:
                body = await self._body(requests)
            except BadMessage as err:  # in the shape of the API the request is for
                shape = openai.error if openai.is_openai(head.second) else _native
                writer.write(shape(err.status, str(err), close=True))
                await _linger(reader, writer)
                return
            if not await self._request(head, body, client, forwarded):
                return

    async def _body(self, requests: Requests) -> Body:
        deadline = self.loop.time() + BODY_S
        try:
            async with asyncio.timeout_at(deadline):
                body = await requests.body()
        except TimeoutError:
            raise BadMessage(f"the body did not come within {BODY_S:g}s", 408) from None
        body.deadline = deadline
        return body

    async def _request(self, head: Head, body: Body, client: Client, forwarded: bytes) -> bool:
        """Route one request, received whole (or its body's start); whether the client
        connection stays open."""
        began = time.perf_counter()
        writer = client[1]
        target = head.second
        keep = head.third == b"HTTP/1.1" and b"close" not in head.tokens(b"connection")
        keep = keep or b"keep-alive" in head.tokens(b"connection")
        if openai.is_openai(target):
            return await self._openai(head, body, client, forwarded, keep)
        name, _, rest = target[1:].partition(b"/") if target.startswith(b"/") else (b"", b"", b"")
        name, query, params = name.partition(b"?")
        path = b"/" + rest if not query else b"/" + query + params
        shown = name.decode("ascii", "replace")
        service = await self._service(lambda: self.traffic.get(shown))
        if service is None or service.gone:
            keep = keep and not body.left  # the rest of its body unread: the connection ends
            writer.write(_native(404, f"no service {shown[:60]!r}", close=not keep))
            return keep
        request = Request(head, body, name, path, forwarded)
        return await self._route(service, request, began, client, keep, _native)

    async def _openai(
        self, head: Head, body: Body, client: Client, forwarded: bytes, keep: bool
    ) -> bool:
        """A request to the OpenAI API (router_openai.py): to the service of its `model`."""
        began = time.perf_counter()
        path = openai.path_of(head.second)
        try:
            if path == openai.MODELS or path.startswith(openai.MODELS + b"/"):
                await self._service(lambda: None)  # the table, once the router has one
                client[1].write(
                    openai.models_answer(self.traffic, path, not keep or bool(body.left))
                )
                return keep and not body.left
            if path not in openai.ROUTED:
                raise openai.unknown_path(head)
            model = openai.model_of(body)
            service = await self._service(lambda: self.traffic.by_model(model))
            if service is None or service.gone:
                raise openai.not_found(model)
        except openai.Refused as err:
            keep = keep and not body.left  # the rest of its body unread: the connection ends
            client[1].write(openai.refused(err, close=not keep))
            if body.left:
                await _linger(client.reader, client.writer)
            return keep
        request = Request(head, body, b"", head.second, forwarded)
        return await self._route(service, request, began, client, keep, openai.error)

    async def _route(
        self,
        service: ServiceTraffic,
        request: Request,
        began: float,
        client: Client,
        keep: bool,
        shape: Shape,
    ) -> bool:
        """`request` to a replica of `service`, errors answered in `shape`; whether the client
        connection stays open."""
        writer = client[1]
        service.last_request = time.monotonic()
        deadline = service.last_request + WAIT_S
        unreached = 0
        while True:
            if unreached > 1:  # a replica that resets every connection is not tried in a spin
                await asyncio.sleep(min(UNREACHED_PAUSE_S * unreached, 0.5))
            found = await self._endpoint(service)
            if isinstance(found, str):
                if found == "gone":
                    writer.write(shape(404, f"service {service.name} was deleted", close=True))
                    return False
                service.statuses[503] += 1
                writer.write(shape(503, found, close=True, extra=_RETRY))
                return False
            try:
                return await self._send(service, found, request, began, client, keep, shape)
            except UpstreamRefused as err:
                unreached += 1
                # it never reached that replica: another one takes it, or it waits for one (a
                # refused replica is marked broken; a stale or reset connection was dropped)
                if time.monotonic() >= deadline:
                    service.statuses[503] += 1
                    writer.write(shape(503, str(err), close=True, extra=_RETRY))
                    return False

    async def _service(self, find: Callable[[], ServiceTraffic | None]) -> ServiceTraffic | None:
        """What `find` finds in the table; until the router has one, a request it finds
        nothing for waits for it rather than getting 404."""
        if not self.known.is_set() and find() is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.known.wait(), WAIT_S)
        return find()

    async def _send(
        self,
        service: ServiceTraffic,
        found: Endpoint,
        request: Request,
        began: float,
        client: Client,
        keep: bool,
        shape: Shape,
    ) -> bool:
        """The request through `found`, counted; whether the client connection may stay open.
        UpstreamRefused (uncounted) when the replica could not be reached at all."""
        writer = client[1]
        status: int | None = 502
        self._active += 1
        found.in_flight += 1
        service.in_flight += 1
        self.busy.add(found)
        try:
            status, keep_client = await self._upstreams.forward(
                request, found, service.owner, client, keep
            )
            return keep_client
        except (UpstreamRefused, ClientGone):
            status = None
            raise
        except UpstreamFailed as err:
            writer.write(shape(502, str(err), close=True))
            return False
        except BadMessage as err:  # the rest of a streamed body did not come in time
            status = err.status
            writer.write(shape(err.status, str(err), close=True))
            return False
        finally:
            found.in_flight -= 1
            service.in_flight -= 1
            if not found.in_flight:
                self.busy.discard(found)
            self._active -= 1
            if status is not None:
                service.statuses[status] += 1
                service.latency.observe(time.perf_counter() - began)
            self._wake_one(service.name)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send the answer and half-close, then read what the client still sends for a moment:
    closing with its request unread would reset the connection, the answer unseen."""
    with contextlib.suppress(Exception):
        writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            while await reader.read(PIECE):
                pass


def _seen(task: asyncio.Task[None]) -> None:
    """Take a lost connection's error, so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _native(
    status: int, message: str, *, close: bool, extra: Sequence[tuple[bytes, bytes]] = ()
) -> bytes:
    """An error answer of a /NAME path: `{"error", "message"}`, as the daemon's API answers."""
    headers = list(extra) + ([(b"Connection", b"close")] if close else [])
    error = _ERRORS.get(status, "BadRequest")
    return json_answer(status, REASONS.get(status, "Error"), error, message, headers)
