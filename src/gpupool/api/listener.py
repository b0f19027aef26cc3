"""One connection to the daemon's listeners, bounded as a hardened server's is (docs/limits.md).

uvicorn's httptools protocol bounds none of what a client may hold: httptools gathers a header
line whole before handing it over (one 64 MiB line was 64 MiB of the daemon's memory), uvicorn
times a connection out only after it has answered a request on it (one that never sends a
complete head stays open for ever), and its `limit_concurrency` answers 503 to requests rather
than refusing connections. 20,000 idle connections from one outsider took every descriptor of the
daemon, and with them the Unix socket. So the protocol here, for each connection:

- counts it in its listener's budget, per peer (a uid on the Unix socket, an IP address over
  TCP) and in all, and closes it at once past either count: accepted and closed, so the listen
  backlog never fills with the flood and the other listener keeps its own budget;
- feeds the parser at most `max_head_bytes` of a request head and `max_headers` header lines,
  then answers 431 (after which it reads and drops what the client still sends for a moment, so
  that the answer is not lost to a reset);
- closes it when it sends no request within `idle_timeout_s` (uvicorn's keep-alive timer, armed
  from the start too), no complete head within `head_timeout_s` of the head's first byte, or no
  complete body within `body_timeout_s` of the head's end;
- puts the caller's identity in every request's scope: the uid of the peer of a Unix socket
  (SO_PEERCRED), or the mark of a TCP connection, where the bearer token decides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, MutableMapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpupool.api.guard import OVER_TCP, PEER_UID
from gpupool.core.errors import InvalidRequest
from gpupool.core.settings import ListenerLimits
from gpupool.core.units import parse_bytes, parse_duration
from gpupool.isolation.sock_owner import peer_uid

Scope = MutableMapping[str, Any]
Asgi = Callable[[Scope, Any, Any], Awaitable[None]]
#: how long a refused head's connection is read (and dropped) before it is closed
LINGER_S = 2.0
#: share of the open-file limit each listener may hold: the rest is for the jobs' accounting
#: regions, the router and the other listener
NOFILE_SHARE = 4


class HeadTooLarge(Exception):
    """Raised in a parser callback to stop parsing a head past a limit (httptools turns it into
    an HttpParserCallbackError, which uvicorn answers through `send_400_response`)."""


class Budget:
    """The connections open on one listener: at most `total`, at most `per_peer` from one peer."""

    def __init__(self, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        self.count = 0
        self.by_peer: Counter[Hashable] = Counter()

    def take(self, peer: Hashable) -> bool:
        """Count a connection of `peer`, unless either count is full."""
        if self.count >= self.total or self.by_peer[peer] >= self.per_peer:
            return False
        self.count += 1
        self.by_peer[peer] += 1
        return True

    def give(self, peer: Hashable) -> None:
        """A counted connection of `peer` ended."""
        self.count -= 1
        self.by_peer[peer] -= 1
        if self.by_peer[peer] <= 0:
            del self.by_peer[peer]

    @classmethod
    def of_listener(cls, limits: ListenerLimits, open_files: int) -> Budget:
        """A listener's budget: `limits`, and never more than its share of `open_files`."""
        total = max(1, min(limits.max_connections, open_files // NOFILE_SHARE))
        return cls(total, limits.max_connections_per_peer)


def _answer_431(message: str) -> bytes:
    body = json.dumps({"error": "InvalidRequest", "message": message}).encode()
    head = (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\n"
        b"content-length: %d\r\n"
        b"connection: close\r\n\r\n" % len(body)
    )
    return head + body


class ListenerProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above and the caller's identity."""

    def __init__(
        self, config: Any, server_state: Any, app_state: Any, budget: Budget, limits: ListenerLimits
    ) -> None:
        super().__init__(config, server_state, app_state)
        # uvicorn's keep-alive timer, after each response (and here before the first request);
        # typed int there, used only as a delay of call_later
        self.timeout_keep_alive = limits.idle_timeout_s  # type: ignore[assignment]
        self.budget = budget
        self.limits = limits
        #: the peer counted in the budget (None: not counted, or given back)
        self.peer: Hashable | None = None
        #: bytes the parser may still take of the current head (None: in a body)
        self.head_left: int | None = limits.max_head_bytes
        self.header_lines = 0
        #: the head's or the body's deadline
        self.deadline: asyncio.TimerHandle | None = None
        #: why the head being parsed is refused, set by a parser callback
        self.refusal: str | None = None
        #: the 431 is sent: what the client still sends is dropped
        self.lingering = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        unix = sock is not None and sock.family == socket.AF_UNIX
        peer: Hashable = peer_uid(sock) if unix else str((self.client or ("",))[0])
        if not self.budget.take(peer):
            transport.close()
            return
        self.peer = peer
        self._add_to_scope({PEER_UID: peer} if unix else {OVER_TCP: True})
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def _add_to_scope(self, extra: dict[str, Any]) -> None:
        inner: Asgi = self.app

        async def app(scope: Scope, receive: Any, send: Any) -> None:
            scope.update(extra)
            await inner(scope, receive, send)

        self.app = app

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._cancel_deadline()
        if self.peer is not None:
            self.budget.give(self.peer)
            self.peer = None

    def data_received(self, data: bytes) -> None:
        while data and not self.lingering and not self.transport.is_closing():
            if self.head_left is None:
                super().data_received(data)
                return
            if self.deadline is None:
                self._arm(self.limits.head_timeout_s)
            piece, data = data[: self.head_left], data[self.head_left :]
            self.head_left -= len(piece)
            super().data_received(piece)
            if self.head_left == 0 and not self.transport.is_closing():
                self._refuse_head(f"a request head of more than {self.limits.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.header_lines = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_lines += 1
        if self.header_lines > self.limits.max_headers:
            self.refusal = f"a request head of more than {self.limits.max_headers} header lines"
            raise HeadTooLarge(self.refusal)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.head_left = None
        self._arm(self.limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._cancel_deadline()
        self.head_left = self.limits.max_head_bytes

    def send_400_response(self, msg: str) -> None:
        if self.refusal is None:
            super().send_400_response(msg)
        else:
            self._refuse_head(self.refusal)

    def _refuse_head(self, message: str) -> None:
        """431, then read and drop for LINGER_S: closing at once with the rest of a large head
        unread would reset the connection, and the client could lose the answer."""
        self._cancel_deadline()
        self.lingering = True
        self.transport.write(_answer_431(message))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.deadline = self.loop.call_later(LINGER_S, self._expire)

    def _arm(self, seconds: float) -> None:
        self._cancel_deadline()
        self.deadline = self.loop.call_later(seconds, self._expire)

    def _cancel_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expire(self) -> None:
        self.deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def _option_name(field: dataclasses.Field[Any]) -> str:
    return field.name.removesuffix("_s").replace("_", "-")


def _value(field: dataclasses.Field[Any], text: str) -> float | int:
    if field.name.endswith("_s"):
        return parse_duration(text)
    return parse_bytes(text) if field.name.endswith("_bytes") else int(text)


def parse_limits(texts: list[str], base: ListenerLimits) -> ListenerLimits:
    """`base` with the `NAME=VALUE` changes of `texts` (`head-timeout=2s`, `max-head-bytes=16Ki`,
    `max-connections-per-peer=32`), or InvalidRequest naming the one that is wrong."""
    fields = {_option_name(field): field for field in dataclasses.fields(ListenerLimits)}
    changes: dict[str, Any] = {}
    for text in texts:
        name, _, value = text.partition("=")
        field = fields.get(name.strip())
        if field is None:
            known = ", ".join(fields)
            raise InvalidRequest(
                f"invalid --listener-limit {text!r}: use NAME=VALUE, NAME one of {known}"
            )
        try:
            changes[field.name] = _value(field, value.strip())
        except (InvalidRequest, ValueError):
            changes[field.name] = 0
        if changes[field.name] <= 0:
            raise InvalidRequest(
                f"invalid --listener-limit {text!r}: the value must be a positive "
                + ("duration (e.g. 10s)" if field.name.endswith("_s") else "whole number")
            )
    return dataclasses.replace(base, **changes)
