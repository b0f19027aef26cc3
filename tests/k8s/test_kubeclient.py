"""The official-client seam on the wire: patches are JSON merge patches that carry the pod's UID."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from gpupool.core.errors import KubeApiError
from gpupool.k8s.kubeclient import OfficialKube


class _ApiServer(BaseHTTPRequestHandler):
    """Records each request; answers the status the test sets."""

    seen: ClassVar[list[tuple[str, str, str, Any]]] = []
    status = 200

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.command, self.path, self.headers["Content-Type"], body))
        answer = b'{"kind": "Status", "code": 409, "reason": "Conflict"}'
        answer = b"{}" if self.status == 200 else answer
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def kube() -> Iterator[OfficialKube]:
    from kubernetes import client

    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _ApiServer.seen.clear()
    _ApiServer.status = 200
    # as the in-cluster or kubeconfig loading leaves it, pointed at this server
    kube = OfficialKube.__new__(OfficialKube)
    kube.client = client
    config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    kube.core = client.CoreV1Api(client.ApiClient(config))
    yield kube
    server.shutdown()


def test_a_pod_patch_is_a_merge_patch_with_the_uid_as_precondition(kube: OfficialKube) -> None:
    kube.patch_pod_annotations("team", "p", "uid-1", {"gpupool.io/gpus": "0", "gone": None})
    assert _ApiServer.seen == [
        (
            "PATCH",
            "/api/v1/namespaces/team/pods/p",
            "application/merge-patch+json",
            {"metadata": {"uid": "uid-1", "annotations": {"gpupool.io/gpus": "0", "gone": None}}},
        )
    ]


def test_a_refused_precondition_is_a_kube_api_error(kube: OfficialKube) -> None:
    _ApiServer.status = 409
    with pytest.raises(KubeApiError, match="annotate pod team/p: the API server answered 409"):
        kube.patch_pod_annotations("team", "p", "uid-old", {"a": "1"})


def test_a_node_patch_is_a_merge_patch(kube: OfficialKube) -> None:
    kube.patch_node_annotations("gpu-1", {"gpupool.io/gpu-inventory": "[]"})
    assert _ApiServer.seen == [
        (
            "PATCH",
            "/api/v1/nodes/gpu-1",
            "application/merge-patch+json",
            {"metadata": {"annotations": {"gpupool.io/gpu-inventory": "[]"}}},
        )
    ]
