"""The mutating admission webhook: pods that ask for gpupool GPUs go to gpupool's scheduler.

A pod asking for `gpupool.io/*` resources gets `spec.schedulerName` set to the scheduler that
calls the extender; a malformed ask (a negative quantity, compute above 100) is refused at
creation with one line, rather than left pending. Other pods pass untouched.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from fastapi import FastAPI, Request, Response

from gpupool.core.errors import InvalidRequest
from gpupool.k8s import names
from gpupool.k8s.podspec import gpu_ask

DEFAULT_SCHEDULER = "default-scheduler"


def review(admission: dict[str, Any], scheduler: str = names.SCHEDULER_NAME) -> dict[str, Any]:
    """AdmissionReview (admission.k8s.io/v1) in, AdmissionReview with the response out."""
    request = admission.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    pod = request.get("object") or {}
    try:
        ask = gpu_ask(pod)
    except InvalidRequest as err:
        response["allowed"] = False
        response["status"] = {"code": 400, "message": str(err)}
        ask = None
    current = (pod.get("spec") or {}).get("schedulerName")
    if ask is not None and current in (None, "", DEFAULT_SCHEDULER):
        op = "replace" if current else "add"
        patch = [{"op": op, "path": "/spec/schedulerName", "value": scheduler}]
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {
        "apiVersion": admission.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


def create_app(scheduler: str = names.SCHEDULER_NAME) -> FastAPI:
    app = FastAPI(title="gpupool webhook", docs_url=None, redoc_url=None)

    async def mutate(request: Request) -> Response:
        try:
            admission = json.loads(await request.body())
            if not isinstance(admission, dict):
                raise TypeError("not an object")
        except (ValueError, TypeError) as err:
            body = json.dumps({"error": f"malformed AdmissionReview: {err}"})
            return Response(body, 400, media_type="application/json")
        return Response(json.dumps(review(admission, scheduler)), media_type="application/json")

    app.add_api_route("/mutate", mutate, methods=["POST"])
    app.add_api_route("/healthz", lambda: {"ok": True}, methods=["GET"])
    return app
