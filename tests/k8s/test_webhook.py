"""The mutating webhook over real HTTP: gpupool pods go to gpupool's scheduler."""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import httpx
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
