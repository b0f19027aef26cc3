"""The extender's HTTP face: POST /filter, /prioritize, /bind (kube-scheduler extender JSON).

Bodies are decoded with the json module rather than pydantic models: ExtenderArgs may carry
10,000 node names, and the extender must answer within milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from gpupool.core.errors import GpupoolError
from gpupool.k8s.extender import Extender


def _json(body: Any, status: int = 200) -> Response:
    text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return Response(text, status, media_type="application/json")


async def _args(request: Request) -> dict[str, Any]:
    try:
        args = json.loads(await request.body())
    except ValueError as err:
        raise GpupoolError(f"malformed JSON: {err}") from err
    if not isinstance(args, dict):
        raise GpupoolError("the body must be a JSON object")
    return args


def _verb(call: Callable[[dict[str, Any]], Any], *, waits: bool) -> Callable[[Request], Any]:
    """A route for one verb; one that `waits` on the API server runs in a worker thread, the
    others answer from the cache in the event loop (a thread hop costs a millisecond)."""

    async def handle(request: Request) -> Response:
        try:
            args = await _args(request)
        except GpupoolError as err:
            return _json({"error": str(err)}, 400)
        if waits:
            return _json(await run_in_threadpool(call, args))
        return _json(call(args))

    return handle


def create_app(extender: Extender) -> FastAPI:
    """The FastAPI app serving one extender."""
    app = FastAPI(title="gpupool scheduler extender", docs_url=None, redoc_url=None)
    app.add_api_route("/filter", _verb(extender.filter, waits=False), methods=["POST"])
    app.add_api_route("/prioritize", _verb(extender.prioritize, waits=False), methods=["POST"])
    app.add_api_route("/bind", _verb(extender.bind, waits=True), methods=["POST"])
    app.add_api_route("/healthz", lambda: {"ok": True}, methods=["GET"])
    return app
