"""The extender answers every input: before any inventory, ill-typed bodies, failed binds."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from k8s_support import ExtenderServer, gpu_pod
from test_extender import cluster

from gpupool.k8s import names
from gpupool.k8s.extender import Extender
from gpupool.k8s.extender_http import create_app
from gpupool.k8s.fleet import UNKNOWN_NODE
from gpupool.k8s.kubeapi import InMemoryKube

BIND = {"podName": "p", "podNamespace": "default", "podUID": "uid-default-p", "node": "node-0"}


def test_before_any_inventory_every_node_is_answered_cleanly() -> None:
    api = InMemoryKube()
    for name in ("a", "b"):
        api.add_node(name)  # no device plugin has published its GPUs yet
    pod = api.add_pod(gpu_pod("p", memory="10Gi"))
    with ExtenderServer(Extender(api)) as http:
        for args in (
            {"Pod": pod, "NodeNames": ["a", "b"]},
            {"Pod": pod, "Nodes": {"items": [copy.deepcopy(n) for n in api.nodes.values()]}},
        ):
            filtered = http.post("/filter", json=args)
            assert filtered.status_code == 200
            answer = filtered.json()
            assert answer["failedAndUnresolvableNodes"] == {"a": UNKNOWN_NODE, "b": UNKNOWN_NODE}
            assert answer["failedNodes"] == {}
            scores = http.post("/prioritize", json=args)
            assert scores.status_code == 200
            assert scores.json() == [{"host": "a", "score": 0}, {"host": "b", "score": 0}]
        bound = http.post("/bind", json={**BIND, "node": "a"}).json()
        assert bound == {"error": "node a: gpupool knows no GPU inventory for it"}
        unknown = http.post("/bind", json={**BIND, "node": "nowhere"}).json()
        assert unknown == {"error": "node nowhere not found"}
    assert api.pods[("default", "p")]["metadata"]["annotations"] == {}
    assert "nodeName" not in api.pods[("default", "p")]["spec"]


POD = gpu_pod("p", memory="10Gi")


def _with(path: str, value: Any) -> dict[str, Any]:
    pod = copy.deepcopy(POD)
    target = pod
    *parents, last = path.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value
    return pod


@pytest.mark.parametrize(
    ("verb", "body", "reason"),
    [
        ("/filter", {"Pod": "x", "NodeNames": ["node-0"]}, "Pod must be an object, not str"),
        ("/filter", {"NodeNames": ["node-0"]}, "ExtenderArgs without a Pod"),
        (
            "/filter",
            {"Pod": _with("spec.containers", "x"), "NodeNames": []},
            "Pod.spec.containers must be a list, not str",
        ),
        (
            "/prioritize",
            {"Pod": _with("spec.containers.0.resources.limits", "x"), "NodeNames": []},
            "Pod.spec.containers[0].resources.limits must be an object, not str",
        ),
        (
            "/filter",
            {"Pod": _with("spec.containers.0.resources.limits", {"gpupool.io/gpu": [1]})},
            "Pod.spec.containers[0].resources.limits['gpupool.io/gpu'] must be a quantity, "
            "not list",
        ),
        ("/filter", {"Pod": POD, "NodeNames": [1, {}]}, "NodeNames[0] must be a string, not int"),
        (
            "/filter",
            {"Pod": POD, "NodeNames": ["a", {}]},
            "NodeNames[1] must be a string, not dict",
        ),
        (
            "/prioritize",
            {"Pod": POD, "NodeNames": "node-0"},
            "NodeNames must be a list of node names, not str",
        ),
        ("/filter", {"Pod": POD, "Nodes": "x"}, "Nodes must be a NodeList object, not str"),
        (
            "/filter",
            {"Pod": POD, "Nodes": {"items": [1]}},
            "Nodes.items[0] must be an object, not int",
        ),
        (
            "/filter",
            {"Pod": POD, "Nodes": {"items": [{"metadata": {"name": 3}}]}},
            "Nodes.items[0].metadata.name must be a string, not int",
        ),
        ("/filter", {"Pod": POD, "Nodes": {"items": [{}]}}, "Nodes.items[0].metadata is missing"),
        ("/filter", {"Pod": _with("metadata", [])}, "Pod.metadata must be an object, not list"),
        ("/filter", {"Pod": _with("spec", 1)}, "Pod.spec must be an object, not int"),
        ("/bind", {**BIND, "podName": 1}, "PodName must be a string, not int"),
        ("/bind", {**BIND, "podUID": []}, "PodUID must be a string, not list"),
        ("/bind", {**BIND, "node": ""}, "Node must not be empty"),
        ("/bind", {**BIND, "podNamespace": True}, "PodNamespace must be a string, not bool"),
        ("/bind", {"podName": "p"}, "PodUID is missing"),
        ("/bind", [], "the body must be a JSON object"),
        ("/filter", 3, "the body must be a JSON object"),
    ],
)
def test_an_ill_typed_body_is_a_400_with_its_reason_and_changes_nothing(
    verb: str, body: Any, reason: str
) -> None:
    api = cluster(nodes=1, per_node=1)
    api.add_pod(copy.deepcopy(POD))
    before = copy.deepcopy(api.pods)
    with ExtenderServer(Extender(api)) as http:
        answer = http.post(verb, json=body)
    assert answer.status_code == 400
    assert answer.json() == {"error": reason}
    assert api.pods == before and api.events == []


@pytest.mark.anyio
async def test_bind_answers_only_a_loopback_peer() -> None:
    api = cluster(nodes=1, per_node=1)
    api.add_pod(copy.deepcopy(POD))
    app = create_app(Extender(api))
    for peer, status in ((("10.0.0.9", 40000), 403), (("::1", 40000), 200)):
        transport = httpx.ASGITransport(app, client=peer)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
            answer = await http.post("/bind", json=BIND)
        assert answer.status_code == status, answer.text
        if status == 403:
            assert answer.json() == {
                "error": "/bind answers only kube-scheduler on this host, not 10.0.0.9"
            }
            assert "nodeName" not in api.pods[("default", "p")]["spec"]
            # filter and prioritize only read: they answer any peer
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
                args = {"Pod": POD, "NodeNames": ["node-0"]}
                assert (await http.post("/filter", json=args)).status_code == 200
    assert api.pods[("default", "p")]["spec"]["nodeName"] == "node-0"


def test_a_bind_with_a_wrong_uid_writes_nothing() -> None:
    api = cluster(nodes=1, per_node=1)
    api.add_pod(copy.deepcopy(POD))
    with ExtenderServer(Extender(api)) as http:
        answer = http.post("/bind", json={**BIND, "podUID": "uid-of-an-older-p"}).json()
    assert answer == {
        "error": "pod default/p has UID uid-default-p, not uid-of-an-older-p: not bound"
    }
    assert api.pods[("default", "p")]["metadata"]["annotations"] == {}


def test_a_failed_binding_removes_what_the_bind_wrote() -> None:
    api = cluster(nodes=1, per_node=1)
    api.add_pod(copy.deepcopy(POD))
    original = api.create_binding

    def failing(*args: Any) -> None:
        api.fail_next = 1
        original(*args)

    api.create_binding = failing  # type: ignore[method-assign]
    with ExtenderServer(Extender(api)) as http:
        answer = http.post("/bind", json=BIND).json()
        assert "timed out" in answer["error"]
        assert api.pods[("default", "p")]["metadata"]["annotations"] == {}
        # nothing stays held either: the retry is bound with the whole GPU free
        api.create_binding = original  # type: ignore[method-assign]
        assert http.post("/bind", json=BIND).json() == {}
    ann = api.pods[("default", "p")]["metadata"]["annotations"]
    assert ann[names.ANN_GPUS] == "0" and ann[names.ANN_MEMORY_BYTES] == str(10 * 2**30)


def test_a_pod_recreated_during_the_bind_is_not_patched() -> None:
    """The patch carries the UID the bind read: the API server refuses it for a new pod."""
    api = cluster(nodes=1, per_node=1)
    api.add_pod(copy.deepcopy(POD))
    original = api.get_pod

    def recreating(namespace: str, name: str) -> dict[str, Any]:
        pod = original(namespace, name)
        fresh = copy.deepcopy(POD)
        fresh["metadata"]["uid"] = "uid-new"
        api.add_pod(fresh)  # deleted and created again, by a controller, under the same name
        return pod

    api.get_pod = recreating  # type: ignore[method-assign]
    with ExtenderServer(Extender(api)) as http:
        answer = http.post("/bind", json=BIND).json()
    assert "409 Precondition failed: UID in precondition: uid-default-p" in answer["error"]
    assert api.pods[("default", "p")]["metadata"]["annotations"] == {}
    assert "nodeName" not in api.pods[("default", "p")]["spec"]
