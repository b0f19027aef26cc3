"""The OpenAI API at the router's root: `/v1/...` routed by the JSON body's `model`.

`POST /v1/chat/completions`, `/v1/completions` and `/v1/embeddings` go, their path unchanged
(OpenAI-compatible servers such as vLLM and llama.cpp serve there), to the service that answers
for the body's `model` (a service's `--model` names, by default its own name; the daemon refuses
a second service for a name). The body is the one the router read before it takes a replica slot
(router_body.py): a larger one than BODY_BUFFER gets 413, as the model cannot be read from its
start. `GET /v1/models` lists the models of every service, `GET /v1/models/NAME` one. Every
error on these paths is in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`,
so an OpenAI client reads it as it would OpenAI's own.

`/v1/` is the OpenAI API's and no service's: the daemon refuses `v1` as a service name
(services.RESERVED_NAMES), and every other `/NAME/...` path is the service NAME's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from gpupool.agent.service_traffic import ServiceTraffic, Traffic
from gpupool.api.router_body import BODY_BUFFER, Body
from gpupool.api.router_http import REASONS, Head

#: the paths routed by the body's `model`
ROUTED = frozenset({b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"})
MODELS = b"/v1/models"
_PREFIX = b"/v1/"
_TYPES = {502: "server_error", 503: "server_error"}
_CODES = {404: "model_not_found", 413: "request_too_large", 502: "bad_gateway"}
_CODES |= {503: "service_unavailable", 408: "request_timeout"}


class Refused(Exception):
    """A request the router answers itself, with `status` and OpenAI's error shape."""

    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def is_openai(target: bytes) -> bool:
    """Whether a request target is the OpenAI API's (`/v1/...`, `/v1`)."""
    return target.startswith(_PREFIX) or target.partition(b"?")[0] == b"/v1"


def path_of(target: bytes) -> bytes:
    return target.partition(b"?")[0]


def model_of(body: Body) -> str:
    """The `model` of a routed request's JSON body; Refused (400, 413) when it has none."""
    if body.left:
        raise Refused(
            413,
            f"the body is larger than {BODY_BUFFER} bytes: the router reads `model` from a "
            "body of at most that",
        )
    try:
        data = json.loads(body.data)
    except ValueError:
        raise Refused(400, "the body is not JSON: a JSON object with `model`") from None
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str) or not model:
        raise Refused(400, "the body has no `model` (a string)", "missing_model", "model")
    return model


def not_found(model: str) -> Refused:
    return Refused(
        404,
        f"The model `{model[:128]}` does not exist (GET /v1/models lists those served here)",
        "model_not_found",
        "model",
    )


def unknown_path(head: Head) -> Refused:
    method = head.first.decode("ascii", "replace")
    target = path_of(head.second).decode("ascii", "replace")[:100]
    return Refused(404, f"Invalid URL ({method} {target})", "unknown_url")


def _model(model: str, service: ServiceTraffic) -> dict[str, object]:
    return {
        "id": model,
        "object": "model",
        "created": int(service.created),
        "owned_by": service.user or service.name,
    }


def models_answer(traffic: Traffic, path: bytes, close: bool) -> bytes:
    """GET /v1/models (every service's models) or /v1/models/NAME (Refused 404 if none)."""
    if path == MODELS:
        listed = [_model(m, s) for s in traffic.all() if not s.gone for m in s.models]
        return answer(200, {"object": "list", "data": listed}, close=close)
    wanted = path[len(MODELS) + 1 :].decode("utf-8", "replace")
    service = traffic.by_model(wanted)
    if service is None or service.gone:
        raise not_found(wanted)
    return answer(200, _model(wanted, service), close=close)


def error(
    status: int,
    message: str,
    *,
    close: bool,
    extra: Sequence[tuple[bytes, bytes]] = (),
    code: str | None = None,
    param: str | None = None,
) -> bytes:
    """A whole error answer in OpenAI's shape."""
    body = {
        "message": message,
        "type": _TYPES.get(status, "invalid_request_error"),
        "param": param,
        "code": code if code is not None else _CODES.get(status),
    }
    return answer(status, {"error": body}, close=close, extra=extra)


def refused(err: Refused, close: bool) -> bytes:
    return error(err.status, str(err), close=close, code=err.code, param=err.param)


def answer(
    status: int, data: object, *, close: bool, extra: Sequence[tuple[bytes, bytes]] = ()
) -> bytes:
    body = json.dumps(data).encode()
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}".encode()]
    lines += [b"Content-Type: application/json", b"Content-Length: " + str(len(body)).encode()]
    lines += [k + b": " + v for k, v in extra]
    lines += [b"Connection: close"] if close else []
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
