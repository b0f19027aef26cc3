"""The admission webhook: gpupool pods go to gpupool's scheduler; forged shares are refused.

A pod asking for `gpupool.io/*` resources gets `spec.schedulerName` set to the scheduler that
calls the extender; a malformed ask (a negative quantity, compute above 100) is refused at
creation with one line, rather than left pending. A share comes only from the extender: a pod
created with gpupool's allocation annotations, or asking for gpupool GPUs with spec.nodeName
set (which skips the scheduler), is refused, and so is a change to a pod's gpupool.io
annotations by anyone but the extender's and the device plugins' service accounts (the
AdmissionReview's userInfo). The device plugin checks the extender's signature all the same:
this is the first line, the signature the last. Other pods pass untouched.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from fastapi import FastAPI, Request, Response

from gpupool.core.errors import InvalidRequest, PermissionDenied
from gpupool.k8s import names
from gpupool.k8s.extender_args import check_pod
from gpupool.k8s.podspec import Pod, gpu_ask, gpu_count, pod_annotations

DEFAULT_SCHEDULER = "default-scheduler"
_PREFIX = "gpupool.io/"


def _gpupool_annotations(pod: Pod) -> dict[str, str]:
    return {k: v for k, v in pod_annotations(pod).items() if k.startswith(_PREFIX)}


def _check_create(pod: Pod) -> None:
    forged = sorted(set(pod_annotations(pod)) & set(names.ALLOCATION_ANNOTATIONS))
    if forged:
        raise PermissionDenied(
            f"a pod may not be created with {', '.join(forged)}: only the gpupool extender "
            "writes a pod's allocation"
        )
    if gpu_count(pod) and (pod.get("spec") or {}).get("nodeName"):
        raise PermissionDenied(
            f"a pod asking for {names.RESOURCE_GPU} may not set spec.nodeName: "
            f"{names.SCHEDULER_NAME} places it"
        )


def _check_update(old: Pod, new: Pod, user: str, trusted: frozenset[str]) -> None:
    before, after = _gpupool_annotations(old), _gpupool_annotations(new)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed and user not in trusted:
        raise PermissionDenied(
            f"{user or 'an unknown user'} may not change {', '.join(changed)}: only gpupool's "
            "extender and device plugins change a pod's gpupool.io annotations"
        )


def _scheduler_patch(pod: Pod, scheduler: str) -> list[dict[str, str]]:
    current = (pod.get("spec") or {}).get("schedulerName")
    if gpu_ask(pod) is None or current not in (None, "", DEFAULT_SCHEDULER):
        return []
    op = "replace" if current else "add"
    return [{"op": op, "path": "/spec/schedulerName", "value": scheduler}]


def review(
    admission: dict[str, Any],
    scheduler: str = names.SCHEDULER_NAME,
    trusted: frozenset[str] = frozenset(names.DEFAULT_TRUSTED),
) -> dict[str, Any]:
    """AdmissionReview (admission.k8s.io/v1) in, AdmissionReview with the response out."""
    request = admission.get("request")
    request = request if isinstance(request, dict) else {}
    response: dict[str, Any] = {"uid": str(request.get("uid", "")), "allowed": True}
    operation = request.get("operation") or "CREATE"
    info = request.get("userInfo")
    user = info.get("username") if isinstance(info, dict) else None
    try:
        pod = request.get("object") or {}
        check_pod(pod)
        if operation == "CREATE":
            _check_create(pod)
            patch = _scheduler_patch(pod, scheduler)
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        elif operation == "UPDATE":
            old = request.get("oldObject") or {}
            check_pod(old)
            _check_update(old, pod, str(user or ""), trusted)
    except (InvalidRequest, PermissionDenied) as err:
        response = {
            "uid": response["uid"],
            "allowed": False,
            "status": {"code": err.http_status, "message": str(err)},
        }
    return {
        "apiVersion": admission.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


def create_app(
    scheduler: str = names.SCHEDULER_NAME,
    trusted: frozenset[str] = frozenset(names.DEFAULT_TRUSTED),
) -> FastAPI:
    app = FastAPI(title="gpupool webhook", docs_url=None, redoc_url=None)

    async def mutate(request: Request) -> Response:
        try:
            admission = json.loads(await request.body())
            if not isinstance(admission, dict):
                raise TypeError("not an object")
        except (ValueError, TypeError) as err:
            body = json.dumps({"error": f"malformed AdmissionReview: {err}"})
            return Response(body, 400, media_type="application/json")
        answer = review(admission, scheduler, trusted)
        return Response(json.dumps(answer), media_type="application/json")

    app.add_api_route("/mutate", mutate, methods=["POST"])
    app.add_api_route("/healthz", lambda: {"ok": True}, methods=["GET"])
    return app
