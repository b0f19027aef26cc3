"""What every request passes before the app sees it: its Host, its caller, its body's type and size.

A pure ASGI middleware, so that it holds for every route (the docs, the dashboard, a 404) and
counts a body's bytes as they arrive, whether or not the client announced a Content-Length:

- Host: a browser lets a page of any site talk to 127.0.0.1 once its name resolves there (DNS
  rebinding, also through `ssh -L`); a request whose Host is not one of the daemon's own names is
  refused (400), whatever listener it came in on;
- caller: a daemon run by an ordinary user serves that user only (403 for any other uid);
- body: a state-changing request must be JSON (415 otherwise, which a cross-site HTML form cannot
  send without a CORS preflight), and at most MAX_BODY bytes (413).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from gpupool.agent.access import Access
from gpupool.core.errors import PermissionDenied

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

#: ASGI scope keys set by the server for each connection
PEER_UID = "gpupool.peer_uid"
OVER_TCP = "gpupool.tcp"
#: the largest request body the daemon reads (a submit is a few KiB)
MAX_BODY = 1 << 20
#: names that always reach this daemon: loopback, and the host the client puts in its requests
#: over the Unix socket (api/client.py's base URL)
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "gpupool"})
CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def host_names(names: Iterable[str]) -> frozenset[str]:
    """LOCAL_HOSTS and `names` as Host headers carry them (lower case, IPv6 in brackets)."""
    shaped = set(LOCAL_HOSTS)
    for name in names:
        bare = name.strip().strip("[]").lower()
        if bare:
            shaped.add(f"[{bare}]" if ":" in bare else bare)
    return frozenset(shaped)


def _host(value: str) -> str:
    """The name in a Host header, without its port."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1]
    name, sep, port = value.rpartition(":")
    return name if sep and port.isdigit() else value


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class Guard:
    """The checks above, in front of `app`."""

    def __init__(self, app: Asgi, access: Access, hosts: frozenset[str]) -> None:
        self.app = app
        self.access = access
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await _answer(send, *refusal)
            return
        # bodies are small (a submit is a few KiB): read it all here, so that its size is known
        # before any route parses it, announced or not
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                await _answer(send, 413, "InvalidRequest", _too_large())
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        host = _header(scope, b"host")
        if host is None or _host(host) not in self.hosts:
            return (
                400,
                "InvalidRequest",
                f"unknown Host {host!r}: this daemon answers to {', '.join(sorted(self.hosts))} "
                "(add a name with gpupool serve --allowed-host NAME)",
            )
        uid = scope.get(PEER_UID)
        if uid is not None:
            try:
                self.access.refuse_stranger(int(uid))
            except PermissionDenied as err:
                return 403, "PermissionDenied", str(err)
        if scope["method"] in CHANGING:
            kind = (_header(scope, b"content-type") or "").partition(";")[0].strip().lower()
            if kind != "application/json":
                return (
                    415,
                    "InvalidRequest",
                    f"a {scope['method']} request needs a JSON body (Content-Type: "
                    f"application/json), not {kind or 'none'}",
                )
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                return 400, "InvalidRequest", f"invalid Content-Length {length!r}"
            if int(length) > MAX_BODY:
                return 413, "InvalidRequest", _too_large()
        return None


def _too_large() -> str:
    return f"request body over {MAX_BODY} bytes (1 MiB): send less"


async def _answer(send: Send, status: int, error: str, message: str) -> None:
    body = json.dumps({"error": error, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
