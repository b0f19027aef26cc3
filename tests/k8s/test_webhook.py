"""The mutating webhook over real HTTP: gpupool pods go to gpupool's scheduler."""

from __future__ import annotations

import base64
import copy
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from k8s_support import free_port, gpu_pod, wait_for

from gpupool.k8s import names
from gpupool.k8s.webhook import create_app


def admit(http: httpx.Client, pod: dict[str, Any]) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "object": pod},
    }
    response: dict[str, Any] = http.post("/mutate", json=review).json()["response"]
    assert response["uid"] == "u-1"
    return response


def test_webhook_points_gpupool_pods_at_the_scheduler_and_refuses_bad_asks() -> None:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, what="the webhook to listen")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
            pod = gpu_pod("p", memory="10Gi", compute="30")
            del pod["spec"]["schedulerName"]
            mutated = admit(http, pod)
            assert mutated["allowed"] and mutated["patchType"] == "JSONPatch"
            patch = json.loads(base64.b64decode(mutated["patch"]))
            assert patch == [
                {"op": "add", "path": "/spec/schedulerName", "value": names.SCHEDULER_NAME}
            ]

            plain = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}}
            assert admit(http, plain) == {"uid": "u-1", "allowed": True}

            custom = gpu_pod("q", memory="1Gi")
            custom["spec"]["schedulerName"] = "my-scheduler"
            assert "patch" not in admit(http, custom)

            refused = admit(http, gpu_pod("bad", compute="101"))
            assert not refused["allowed"]
            assert refused["status"]["message"] == (
                "invalid gpupool.io/gpu-compute '101': must be 1..100 percent"
            )
            assert http.post("/mutate", content=b"[").status_code == 400
    finally:
        server.should_exit = True
        thread.join(10)


EXTENDER_SA = "system:serviceaccount:gpupool:gpupool-scheduler"


@pytest.fixture(scope="module")
def webhook() -> Iterator[httpx.Client]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, what="the webhook to listen")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
        yield http
    server.should_exit = True
    thread.join(10)


def review_of(http: httpx.Client, request: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    answer = http.post("/mutate", json=body)
    assert answer.status_code == 200
    response: dict[str, Any] = answer.json()["response"]
    return response


def placed_pod(name: str) -> dict[str, Any]:
    return gpu_pod(
        name,
        memory="10Gi",
        annotations={
            names.ANN_NODE: "gpu-1",
            names.ANN_GPUS: "0",
            names.ANN_MEMORY_BYTES: str(80 * 2**30),
            names.ANN_COMPUTE_MILLI: "1000",
        },
    )


@pytest.mark.parametrize("annotation", names.ALLOCATION_ANNOTATIONS)
def test_a_pod_created_with_an_allocation_annotation_is_refused(
    webhook: httpx.Client, annotation: str
) -> None:
    pod = gpu_pod("forged", memory="1Gi", annotations={annotation: "0"})
    response = review_of(webhook, {"uid": "u", "operation": "CREATE", "object": pod})
    assert not response["allowed"]
    assert response["status"] == {
        "code": 403,
        "message": f"a pod may not be created with {annotation}: only the gpupool extender "
        "writes a pod's allocation",
    }


def test_a_gpupool_pod_created_with_a_node_name_is_refused(webhook: httpx.Client) -> None:
    pod = gpu_pod("direct", memory="80Gi")
    pod["spec"]["nodeName"] = "gpu-1"
    response = review_of(webhook, {"uid": "u", "operation": "CREATE", "object": pod})
    assert not response["allowed"]
    assert "may not set spec.nodeName" in response["status"]["message"]
    # a pod without gpupool GPUs may name its node
    plain = {"metadata": {"name": "web"}, "spec": {"nodeName": "gpu-1", "containers": []}}
    assert review_of(webhook, {"uid": "u", "operation": "CREATE", "object": plain})["allowed"]


@pytest.mark.parametrize(
    ("user", "allowed"),
    [
        ("alice", False),
        ("system:serviceaccount:team:default", False),
        (None, False),
        (EXTENDER_SA, True),
        ("system:serviceaccount:gpupool:gpupool-device-plugin", True),
    ],
)
def test_only_gpupool_changes_a_pods_gpupool_annotations(
    webhook: httpx.Client, user: str | None, allowed: bool
) -> None:
    old = placed_pod("p")
    for change in (
        {names.ANN_MEMORY_BYTES: str(80 * 2**30 * 2)},  # a bigger share
        {names.ANN_ALLOCATED: "true"},  # marking itself served
        {names.ANN_PRIORITY: "high"},  # a new priority after placement
    ):
        new = copy.deepcopy(old)
        new["metadata"]["annotations"].update(change)
        request: dict[str, Any] = {"uid": "u", "operation": "UPDATE", "object": new}
        request["oldObject"] = old
        if user is not None:
            request["userInfo"] = {"username": user}
        response = review_of(webhook, request)
        assert response["allowed"] is allowed, response
        if not allowed:
            (key,) = change
            assert response["status"]["code"] == 403
            assert f"may not change {key}" in response["status"]["message"]
    # a change to anything else passes
    new = copy.deepcopy(old)
    new["metadata"].setdefault("labels", {})["team"] = "a"
    request = {"uid": "u", "operation": "UPDATE", "object": new, "oldObject": old}
    assert review_of(webhook, {**request, "userInfo": {"username": "alice"}})["allowed"]


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ("x", "Pod must be an object, not str"),
        ({"spec": {"containers": "x"}}, "Pod.spec.containers must be a list, not str"),
        ({"spec": {"containers": [1]}}, "Pod.spec.containers[0] must be an object, not int"),
        (
            {"spec": {"containers": [{"resources": {"limits": "x"}}]}},
            "Pod.spec.containers[0].resources.limits must be an object, not str",
        ),
        (
            {"metadata": {"annotations": {"a": 1}}},
            "Pod.metadata.annotations['a'] must be a string, not int",
        ),
    ],
)
def test_an_ill_typed_pod_is_refused_with_its_reason(
    webhook: httpx.Client, obj: Any, reason: str
) -> None:
    response = review_of(webhook, {"uid": "u", "operation": "CREATE", "object": obj})
    assert response == {"uid": "u", "allowed": False, "status": {"code": 400, "message": reason}}
