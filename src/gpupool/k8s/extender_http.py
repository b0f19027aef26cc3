"""The extender's HTTP face: POST /filter, /prioritize, /bind (kube-scheduler extender JSON).

/filter and /prioritize are answered by a small ASGI app of their own, in the event loop, with
orjson: a call carries up to 10,000 node names and must be answered within milliseconds, and
Starlette's routing, Request object and Response cost about a millisecond per 200 KB body, the
json module another. /bind (which waits on the API server, in a worker thread) and /healthz go
to a FastAPI app. Every body is checked (extender_args) before use: an ill-typed one is a 400
with the field at fault. /bind binds any pod to any node with the extender's rights, so it
answers only kube-scheduler beside it in the pod: a loopback peer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from gpupool.core.errors import GpupoolError, PermissionDenied
from gpupool.k8s.extender import Extender
from gpupool.k8s.extender_args import check_binding_args, check_extender_args

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON_HEADERS = [(b"content-type", b"application/json")]
_LOOPBACK = ("127.", "::1", "::ffff:127.")

Verb = Callable[[dict[str, Any]], Any]
Check = Callable[[dict[str, Any]], None]


def _encode(answer: Any) -> bytes:
    return answer.encode() if isinstance(answer, str) else orjson.dumps(answer)


def _args(body: bytes) -> dict[str, Any]:
    try:
        args = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise GpupoolError(f"malformed JSON: {err}") from err
    if not isinstance(args, dict):
        raise GpupoolError("the body must be a JSON object")
    return args


def _answer(check: Check, call: Verb, body: bytes) -> tuple[int, bytes]:
    """Status and body of one verb's answer (400 with one line for a body that is not JSON or
    not of the verb's shape)."""
    try:
        args = _args(body)
        check(args)
    except GpupoolError as err:
        return 400, orjson.dumps({"error": str(err)})
    return 200, _encode(call(args))


def loopback(host: str | None) -> bool:
    """Whether a peer address is this host's loopback."""
    return host is not None and (host == "localhost" or host.startswith(_LOOPBACK))


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    length = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + length})
    await send({"type": "http.response.body", "body": body})


class ExtenderApp:
    """ASGI: the cache-only verbs answered directly, everything else by the FastAPI app."""

    def __init__(self, extender: Extender) -> None:
        self.verbs: dict[str, tuple[Check, Verb]] = {
            "/filter": (check_extender_args, extender.filter),
            "/prioritize": (check_extender_args, extender.prioritize),
        }
        self.rest = _fastapi(extender)

    @property
    def paths(self) -> set[str]:
        """Every path served."""
        return set(self.verbs) | {getattr(route, "path", "") for route in self.rest.routes}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self.verbs.get(scope["path"]) if scope["type"] == "http" else None
        if verb is None:
            await self.rest(scope, receive, send)
        elif scope["method"] != "POST":
            body = orjson.dumps({"detail": "Method Not Allowed"})
            await _send(send, 405, body, [*_JSON_HEADERS, (b"allow", b"POST")])
        else:
            status, body = _answer(*verb, await _body(receive))
            await _send(send, status, body, _JSON_HEADERS)


def _fastapi(extender: Extender) -> FastAPI:
    app = FastAPI(title="gpupool scheduler extender", docs_url=None, redoc_url=None)

    async def bind(request: Request) -> Response:
        peer = request.client.host if request.client is not None else None
        if not loopback(peer):
            error = PermissionDenied(f"/bind answers only kube-scheduler on this host, not {peer}")
            body = orjson.dumps({"error": str(error)})
            return Response(body, error.http_status, media_type="application/json")
        status, body = await run_in_threadpool(
            _answer, check_binding_args, extender.bind, await request.body()
        )
        return Response(body, status, media_type="application/json")

    app.add_api_route("/bind", bind, methods=["POST"])
    app.add_api_route("/healthz", lambda: {"ok": True}, methods=["GET"])
    app.add_api_route("/debug/placement", extender.debug, methods=["GET"])
    return app


def create_app(extender: Extender) -> ExtenderApp:
    """The ASGI app serving one extender."""
    return ExtenderApp(extender)
