"""The router (`gpupool serve --router HOST:PORT`): /NAME/... to a ready replica of NAME.

A reverse proxy on asyncio streams, in its own thread and event loop (uvloop) inside the daemon
(docs/inference.md says why this over aiohttp or uvicorn with httpx: it was measured). Each
request goes, its `/NAME` prefix stripped, to the replica of NAME with the fewest requests in
flight that is below the service's concurrency; the answer is copied back as it arrives (a
token stream's first byte is never held). With no such replica the request waits in a bounded
queue while the autoscaler adds one (a wake from zero too); past the queue's bound, or after
WAIT_S, it gets 503 with Retry-After. A replica that fails mid-request gets its request a 502
(or, once the answer has begun, a cut connection), counted like every other answer. Connections
to replicas are kept alive and reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
import time
from collections import deque

import uvloop

from gpupool.agent.service_traffic import Endpoint, ServiceTraffic, Traffic
from gpupool.api.router_http import (
    MAX_HEAD,
    BadMessage,
    Head,
    json_answer,
    read_head,
    relay_body,
)

#: requests one service may have waiting for a replica; more get 503 at once
QUEUE_LIMIT = 256
#: seconds a request waits for a replica (a cold start included) before 503
WAIT_S = 60.0
#: replicas tried for a request that none could be reached for, before 502
REFUSED_TRIES = 3
#: idle connections kept per replica
POOL_SIZE = 64
#: the interpreter's thread switch interval while the router runs
SWITCH_S = 0.0005
#: seconds a client connection may wait between requests (or take to send a head)
IDLE_S = 120.0
#: seconds the router waits for requests in flight when it stops
STOP_GRACE_S = 10.0
_REASONS = {400: "Bad Request", 404: "Not Found", 431: "Request Header Fields Too Large"}
_RETRY = [(b"Retry-After", b"1")]

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Upstream(Exception):
    """The replica failed before its answer began: the client gets a 502."""


class _Refused(_Upstream):
    """The replica could not be reached: the request never left the router."""


class Router:
    """The proxy over one listening socket; `start()` runs it in a thread of its own."""

    def __init__(self, traffic: Traffic, sock: socket.socket) -> None:
        self.traffic = traffic
        self.sock = sock
        self.loop = uvloop.new_event_loop()
        self._pools: dict[int, list[Connection]] = {}
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self._thread = threading.Thread(target=self._run, name="gpupool-router", daemon=True)
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._active = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        def changed() -> None:
            self.loop.call_soon_threadsafe(self._wake_all)

        self.traffic.on_change = changed
        # the router's thread shares the interpreter with the daemon's: a shorter switch
        # interval lets it take the GIL back sooner from a busy thread (default 5 ms)
        sys.setswitchinterval(SWITCH_S)
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        """Stop taking connections, let the requests in flight finish (STOP_GRACE_S), stop."""
        self.traffic.on_change = None
        if self._thread.is_alive():
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
            with contextlib.suppress(Exception):
                future.result(STOP_GRACE_S + 5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(
            asyncio.start_server(self._client, sock=self.sock, limit=MAX_HEAD)
        )
        self._ready.set()
        self.loop.run_forever()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + STOP_GRACE_S
        while self._active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    # -- waiting for a replica -------------------------------------------------------------

    def _wake_all(self) -> None:
        """The endpoints changed: every waiter looks again; connections to replicas no longer
        published (stopped, failed) are closed."""
        live = {e.port for service in self.traffic.all() for e in service.endpoints}
        for port in [port for port in self._pools if port not in live]:
            for _, writer in self._pools.pop(port):
                writer.close()
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
        forwarded = (peer[0] if isinstance(peer, tuple) else "local").encode()
        try:
            while True:
                try:
                    async with asyncio.timeout(IDLE_S):
                        head = await read_head(reader)
                except TimeoutError:
                    break  # an idle (or trickling) client does not hold a connection forever
                except BadMessage as err:
                    writer.write(_error(err.status, "BadRequest", str(err), close=True))
                    break
                if head is None:
                    break
                if not await self._request(head, reader, writer, forwarded):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, BadMessage):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _request(
        self,
        head: Head,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        forwarded: bytes,
    ) -> bool:
        """Route one request; whether the client connection stays open."""
        began = time.perf_counter()
        target = head.second
        name, _, rest = target[1:].partition(b"/") if target.startswith(b"/") else (b"", b"", b"")
        name, query, params = name.partition(b"?")
        path = b"/" + rest if not query else b"/" + query + params
        keep = head.third == b"HTTP/1.1" and b"close" not in head.tokens(b"connection")
        keep = keep or b"keep-alive" in head.tokens(b"connection")
        try:
            has_body = _framed(head)
        except BadMessage as err:
            writer.write(_error(400, "BadRequest", str(err), close=True))
            return False
        service = self.traffic.get(name.decode("ascii", "replace"))
        if service is None or service.gone:
            shown = name.decode("ascii", "replace")[:60]
            writer.write(_error(404, "NotFound", f"no service {shown!r}", close=has_body))
            return keep and not has_body
        service.last_request = time.monotonic()
        for attempt in range(1, REFUSED_TRIES + 1):
            found = await self._endpoint(service)
            if isinstance(found, str):
                if found == "gone":
                    message = f"service {service.name} was deleted"
                    writer.write(_error(404, "NotFound", message, close=True))
                    return False
                service.statuses[503] += 1
                writer.write(_error(503, "Unavailable", found, close=True, extra=_RETRY))
                return False
            try:
                kept = await self._send(
                    service, found, name, head, path, began, (reader, writer), forwarded, keep
                )
                return keep and kept
            except _Refused as err:
                # nothing reached that replica: the request goes to another one (or waits)
                if attempt == REFUSED_TRIES:
                    service.statuses[502] += 1
                    writer.write(_error(502, "BadGateway", str(err), close=True))
        return False

    async def _send(
        self,
        service: ServiceTraffic,
        found: Endpoint,
        name: bytes,
        head: Head,
        path: bytes,
        began: float,
        client: Connection,
        forwarded: bytes,
        keep: bool,
    ) -> bool:
        """The request through `found`, counted; whether the client connection may stay open.
        _Refused (uncounted) when the replica could not be reached at all."""
        reader, writer = client
        status: int | None = 502
        self._active += 1
        found.in_flight += 1
        service.in_flight += 1
        try:
            status, keep_client = await self._forward(
                found, name, head, path, reader, writer, forwarded, keep
            )
            return keep_client
        except _Refused:
            status = None
            raise
        except _Upstream as err:
            writer.write(_error(502, "BadGateway", str(err), close=True))
            return False
        finally:
            found.in_flight -= 1
            service.in_flight -= 1
            self._active -= 1
            if status is not None:
                service.statuses[status] += 1
                service.latency.observe(time.perf_counter() - began)
            self._wake_one(service.name)

    async def _connect(self, endpoint: Endpoint) -> Connection:
        """A kept-alive connection to `endpoint` (one the replica closed is seen at its end
        and dropped: a replica that exits closes them all), or a new one."""
        port = endpoint.port
        pool = self._pools.setdefault(port, [])
        while pool:
            reader, writer = pool.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        try:
            connection = await asyncio.open_connection("127.0.0.1", port, limit=MAX_HEAD)
        except OSError as err:
            endpoint.broken = True  # the others take its requests until it is back or replaced
            raise _Refused(f"the replica on port {port} refused the connection: {err}") from err
        return connection

    async def _exchange(
        self,
        endpoint: Endpoint,
        head: Head,
        sent: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Head]:
        """Send the request (head `sent`, then its body) and read the answer's head (1xx ones
        passed on); _Upstream when the replica fails before its answer began."""
        up_reader, up_writer = await self._connect(endpoint)
        try:
            up_writer.write(sent)
            await relay_body(reader, up_writer, head)
            answer = await read_head(up_reader)
            while answer is not None and answer.second.startswith(b"1"):
                writer.write(answer.encode())  # 100 Continue and the like
                answer = await read_head(up_reader)
        except (OSError, asyncio.IncompleteReadError, BadMessage) as err:
            up_writer.close()
            raise _Upstream(f"replica on port {endpoint.port} failed: {err}") from err
        if answer is None:
            up_writer.close()
            raise _Upstream(f"replica on port {endpoint.port} closed the connection")
        return up_reader, up_writer, answer

    async def _forward(
        self,
        endpoint: Endpoint,
        name: bytes,
        head: Head,
        path: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        forwarded: bytes,
        keep: bool,
    ) -> tuple[int, bool]:
        """Send the request to `endpoint`, copy its answer back; (status, whether the client
        connection may stay open). _Upstream when the replica fails before its answer began."""
        sent = Head(head.first, path, b"HTTP/1.1", head.headers).encode(
            [(b"X-Forwarded-For", forwarded), (b"X-Forwarded-Prefix", b"/" + name)]
        )
        up_reader, up_writer, answer = await self._exchange(endpoint, head, sent, reader, writer)
        status = int(answer.second) if answer.second.isdigit() else 502
        bodiless = head.first == b"HEAD" or status in (204, 304)
        until_close = not bodiless and not answer.chunked and answer.length() is None
        upstream_keep = b"close" not in answer.tokens(b"connection") and not until_close
        client_keep = keep and not until_close
        extra = [] if client_keep else [(b"Connection", b"close")]
        writer.write(answer.encode(extra))
        try:
            if not bodiless:
                await relay_body(up_reader, writer, answer, until_close)
            else:
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, BadMessage):
            # cut mid-answer: the client sees the connection end, counted as a 502
            up_writer.close()
            raise ConnectionResetError("the answer was cut") from None
        if upstream_keep and len(self._pools.setdefault(endpoint.port, [])) < POOL_SIZE:
            self._pools[endpoint.port].append((up_reader, up_writer))
        else:
            up_writer.close()
        return status, client_keep


def _framed(head: Head) -> bool:
    """Whether a request has a body; BadMessage for framing a replica could read otherwise than
    the router (both Content-Length and chunked: the way to smuggle a request past a proxy)."""
    length = head.length()
    if head.chunked and length is not None:
        raise BadMessage("a request may not have both Content-Length and chunked encoding")
    if head.tokens(b"transfer-encoding") - {b"chunked", b""} and not head.chunked:
        raise BadMessage("unsupported Transfer-Encoding: only chunked")
    return head.chunked or bool(length)


def _error(
    status: int,
    error: str,
    message: str,
    *,
    close: bool,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> bytes:
    reason = {502: "Bad Gateway", 503: "Service Unavailable"}.get(status) or _REASONS.get(
        status, "Error"
    )
    headers = list(extra or []) + ([(b"Connection", b"close")] if close else [])
    return json_answer(status, reason, error, message, headers)
