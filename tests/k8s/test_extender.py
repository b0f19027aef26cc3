"""The extender over real HTTP: policies, multi-GPU and exclusive pods, bad input, concurrency."""

from __future__ import annotations

import random
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from k8s_support import ExtenderServer, bind, gpu_pod, wait_for

from gpupool.core.units import GiB
from gpupool.k8s import names
from gpupool.k8s.extender import Extender
from gpupool.k8s.inventory import GpuInfo, encode
from gpupool.k8s.kubeapi import InMemoryKube


def gpus(count: int, memory: int = 80 * GiB, model: str = "H100-80GB") -> str:
    return encode([GpuInfo(i, f"GPU-{model}-{i}", model, memory) for i in range(count)])


def cluster(nodes: int = 2, per_node: int = 2) -> InMemoryKube:
    # every pod runs once bound: the extender binds one waiting pod per node and size
    api = InMemoryKube(run_on_bind=True)
    for n in range(nodes):
        api.add_node(f"node-{n}", {names.ANN_NODE_GPUS: gpus(per_node)})
    return api


def schedule(http: httpx.Client, pod: dict[str, Any], nodes: list[str]) -> str | None:
    """What kube-scheduler does with the extender: filter, prioritize, bind the best."""
    args = {"pod": pod, "nodenames": nodes}
    fit = http.post("/filter", json=args).json()["nodenames"]
    if not fit:
        return None
    scores = http.post("/prioritize", json={**args, "nodenames": fit}).json()
    best = max(scores, key=lambda s: (s["score"], s["host"]))["host"]
    if bind(http, pod["metadata"]["name"], best):
        return None
    return str(best)


def held(api: InMemoryKube) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(node, GPU) -> (milli, bytes, pods), summed from the pods' annotations alone."""
    total: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    for pod in api.pods.values():
        ann = pod["metadata"]["annotations"]
        if not pod.get("spec", {}).get("nodeName") or names.ANN_GPUS not in ann:
            continue
        for gpu in ann[names.ANN_GPUS].split(","):
            entry = total[(pod["spec"]["nodeName"], int(gpu))]
            entry[0] += int(ann[names.ANN_COMPUTE_MILLI])
            entry[1] += int(ann[names.ANN_MEMORY_BYTES])
            entry[2] += 1
    return {k: (v[0], v[1], v[2]) for k, v in total.items()}


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("binpack", "node-0"), ("spread", "node-1"), ("gpupool", "node-0")],
)
def test_policies_choose_nodes_as_named(policy: str, expected: str) -> None:
    api = cluster()
    api.add_pod(gpu_pod("first", compute="40", memory="10Gi"))
    api.add_pod(gpu_pod("second", compute="40", memory="10Gi"))
    with ExtenderServer(Extender(api, policy)) as http:
        assert bind(http, "first", "node-0") == {}
        assert schedule(http, api.pods[("default", "second")], ["node-0", "node-1"]) == expected
    first = api.pods[("default", "first")]["metadata"]["annotations"][names.ANN_GPUS]
    second = api.pods[("default", "second")]["metadata"]["annotations"][names.ANN_GPUS]
    if expected == "node-0" and policy != "spread":
        assert first == second  # best fit: the used GPU, a whole one stays free


def test_multi_gpu_and_exclusive_pods() -> None:
    api = cluster(nodes=1, per_node=4)
    api.add_pod(gpu_pod("share", compute="50", memory="8Gi"))
    api.add_pod(gpu_pod("pair", gpus="2", compute="50", memory="8Gi"))
    api.add_pod(gpu_pod("whole", gpus="3", annotations={names.ANN_MODE: "exclusive"}))
    api.add_pod(gpu_pod("whole2", gpus="2", annotations={names.ANN_MODE: "exclusive"}))
    with ExtenderServer(Extender(api)) as http:
        assert schedule(http, api.pods[("default", "share")], ["node-0"]) == "node-0"
        assert schedule(http, api.pods[("default", "pair")], ["node-0"]) == "node-0"
        # two GPUs are shared now: three exclusive GPUs do not fit, two do
        result = http.post(
            "/filter", json={"pod": api.pods[("default", "whole")], "nodenames": ["node-0"]}
        ).json()
        assert result["nodenames"] == []
        assert result["failedNodes"]["node-0"] == "3 GPUs needed, 2 can take the share now"
        assert schedule(http, api.pods[("default", "whole2")], ["node-0"]) == "node-0"
    pair = api.pods[("default", "pair")]["metadata"]["annotations"][names.ANN_GPUS].split(",")
    whole2 = api.pods[("default", "whole2")]["metadata"]["annotations"][names.ANN_GPUS].split(",")
    assert len(pair) == 2 and len(whole2) == 2 and not set(pair) & set(whole2)


def test_nodes_given_as_objects_are_answered_as_objects() -> None:
    api = InMemoryKube()
    node = {"metadata": {"name": "n", "annotations": {names.ANN_NODE_GPUS: gpus(1)}}}
    pod = gpu_pod("p", memory="1Gi")
    with ExtenderServer(Extender(api)) as http:
        result = http.post("/filter", json={"pod": pod, "nodes": {"items": [node]}}).json()
    assert [n["metadata"]["name"] for n in result["nodes"]["items"]] == ["n"]


def test_a_pod_without_gpupool_resources_passes_everywhere() -> None:
    api = cluster()
    pod = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}}
    with ExtenderServer(Extender(api)) as http:
        result = http.post("/filter", json={"pod": pod, "nodenames": ["node-0", "x"]}).json()
    assert result["nodenames"] == ["node-0", "x"]


def test_a_node_with_more_gpus_than_gpupool_places_on_is_left_out_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = InMemoryKube()
    api.add_node("huge", {names.ANN_NODE_GPUS: gpus(40)})
    api.add_node("node-0", {names.ANN_NODE_GPUS: gpus(2)})
    extender = Extender(api)
    extender.resync()
    with ExtenderServer(extender) as http:
        args = {"pod": api.add_pod(gpu_pod("p")), "nodenames": ["huge", "node-0"]}
        result = http.post("/filter", json=args).json()
    assert result["nodenames"] == ["node-0"]
    assert "huge" in result["failedAndUnresolvableNodes"]
    assert "node huge: GPU index 39; gpupool places on nodes of at most 32 GPUs" in caplog.text


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"memory": "100Gi"}, "asks for 100GiB per GPU and the largest GPU it may use has 80GiB"),
        ({"memory": "-1Gi"}, "invalid gpupool.io/gpu-memory '-1Gi': must not be negative"),
        ({"memory": "ten"}, "invalid memory size 'ten'"),
        ({"compute": "150"}, "invalid gpupool.io/gpu-compute '150': must be 1..100 percent"),
        ({"gpus": "1.5"}, "invalid gpupool.io/gpu '1.5': a whole number of GPUs"),
    ],
)
def test_bad_asks_fail_every_node_with_one_event_and_bind_nothing(
    limits: dict[str, str], message: str
) -> None:
    api = cluster()
    pod = api.add_pod(gpu_pod("bad", **limits))
    with ExtenderServer(Extender(api)) as http:
        args = {"pod": pod, "nodenames": ["node-0", "node-1"]}
        for _ in range(3):  # the scheduler retries: one event, not one per retry
            result = http.post("/filter", json=args).json()
        assert result["nodenames"] == []
        reasons = {**result["failedNodes"], **result["failedAndUnresolvableNodes"]}
        assert set(reasons) == {"node-0", "node-1"}
        assert all(message in r for r in reasons.values()), reasons
        assert "error" in bind(http, "bad", "node-0")
    wait_for(lambda: api.events, what="the event")
    assert [(e.type, e.involved_name) for e in api.events] == [("Warning", "bad")]
    assert message in api.events[0].message
    assert "nodeName" not in api.pods[("default", "bad")]["spec"]
    assert held(api) == {}


def test_malformed_json_is_a_400_with_one_line() -> None:
    with ExtenderServer(Extender(InMemoryKube())) as http:
        answer = http.post("/filter", content=b"{nope")
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("malformed JSON")


def test_an_api_server_that_times_out_leaves_nothing_held() -> None:
    api = cluster(nodes=1, per_node=1)
    api.add_pod(gpu_pod("a", compute="60", memory="40Gi"))
    api.add_pod(gpu_pod("b", compute="60", memory="40Gi"))
    with ExtenderServer(Extender(api)) as http:
        # get pod and list pods answer, then the annotation patch times out
        api.fail_next = 0
        original = api.patch_pod_annotations

        def timing_out(*args: Any) -> None:
            api.patch_pod_annotations = original  # type: ignore[method-assign]
            api.fail_next = 1
            original(*args)

        api.patch_pod_annotations = timing_out  # type: ignore[method-assign]
        failed = bind(http, "a", "node-0")
        assert "timed out" in failed["error"]
        assert "nodeName" not in api.pods[("default", "a")]["spec"]
        # nothing stayed held: the retry takes the GPU, and b cannot over-commit it
        assert bind(http, "a", "node-0") == {}
        assert "error" in bind(http, "b", "node-0")
    assert held(api) == {("node-0", 0): (600, 40 * GiB, 1)}


def test_a_restarted_extender_reads_what_pods_hold_from_their_annotations() -> None:
    api = cluster(nodes=1, per_node=1)
    api.add_pod(gpu_pod("a", compute="70", memory="10Gi"))
    api.add_pod(gpu_pod("b", compute="70", memory="10Gi"))
    with ExtenderServer(Extender(api)) as http:
        assert bind(http, "a", "node-0") == {}
    with ExtenderServer(Extender(api)) as http:  # a new process: an empty cache
        result = http.post(
            "/filter", json={"pod": api.pods[("default", "b")], "nodenames": ["node-0"]}
        ).json()
    assert result["nodenames"] == []


def test_two_hundred_pods_bound_concurrently_over_commit_no_gpu() -> None:
    rng = random.Random(12)
    api = cluster(nodes=20, per_node=4)
    pods = []
    for i in range(200):
        gpus_asked = rng.choice(["1", "1", "1", "2"])
        compute = rng.choice(["10", "25", "50", "100"]) if gpus_asked == "1" else "100"
        pods.append(
            api.add_pod(gpu_pod(f"p{i}", gpus_asked, f"{rng.choice([4, 10, 20])}Gi", compute))
        )
    nodes = [f"node-{n}" for n in range(20)]
    with ExtenderServer(Extender(api)) as http, ThreadPoolExecutor(16) as pool:
        placed = list(pool.map(lambda p: schedule(http, p, nodes), pods))
    # the pods ask for about twice what the 80 GPUs hold: most of it is taken under contention
    assert 60 <= sum(p is not None for p in placed) < 200
    assert sum(milli for milli, _, _ in held(api).values()) > 0.6 * 80 * 1000
    for (node, gpu), (milli, memory, count) in held(api).items():
        assert milli <= 1000 and memory <= 80 * GiB and count <= names.SLOTS_PER_GPU, (node, gpu)


LOW = {names.ANN_PRIORITY: "low"}


def passes(http: httpx.Client, pod: dict[str, Any], node: str) -> bool:
    result = http.post("/filter", json={"pod": pod, "nodenames": [node]}).json()
    return bool(result["nodenames"] == [node])


def test_a_low_pod_passes_where_high_pods_hold_all_compute_and_is_bound_beside_them() -> None:
    api = cluster(nodes=1, per_node=1)
    api.add_pod(gpu_pod("high", compute="100", memory="40Gi"))
    low = api.add_pod(gpu_pod("low", compute="50", memory="20Gi", annotations=LOW))
    also_high = api.add_pod(gpu_pod("also-high", compute="50", memory="20Gi"))
    with ExtenderServer(Extender(api)) as http:
        assert bind(http, "high", "node-0") == {}
        assert not passes(http, also_high, "node-0")  # the same ask at high: no compute left
        assert passes(http, low, "node-0")
        assert schedule(http, low, ["node-0"]) == "node-0"
    ann = api.pods[("default", "low")]["metadata"]["annotations"]
    # the compute it asked for is still written: the device plugin gives it to the arbiter
    assert ann[names.ANN_COMPUTE_MILLI] == "500"
    assert ann[names.ANN_MEMORY_BYTES] == str(20 * GiB)


def test_a_high_pod_is_not_kept_out_by_a_low_pods_compute() -> None:
    api = cluster(nodes=1, per_node=1)
    api.add_pod(gpu_pod("low", compute="100", memory="10Gi", annotations=LOW))
    high = api.add_pod(gpu_pod("high", compute="100", memory="10Gi"))
    with ExtenderServer(Extender(api)) as http:
        assert bind(http, "low", "node-0") == {}
        assert passes(http, high, "node-0")
    with ExtenderServer(Extender(api)) as http:  # a new process: what the low pod holds re-read
        assert passes(http, high, "node-0")
        assert schedule(http, high, ["node-0"]) == "node-0"


def test_a_low_pod_holds_memory_and_is_refused_for_it() -> None:
    api = cluster(nodes=1, per_node=1)
    api.add_pod(gpu_pod("high", compute="100", memory="50Gi"))
    api.add_pod(gpu_pod("low", compute="100", memory="20Gi", annotations=LOW))
    too_big = api.add_pod(gpu_pod("too-big", compute="10", memory="20Gi", annotations=LOW))
    fits = api.add_pod(gpu_pod("fits", compute="10", memory="10Gi", annotations=LOW))
    with ExtenderServer(Extender(api)) as http:
        assert bind(http, "high", "node-0") == {}
        assert bind(http, "low", "node-0") == {}
        # 10Gi of the GPU's 80Gi is left: memory is checked for a low pod, compute is not
        result = http.post("/filter", json={"pod": too_big, "nodenames": ["node-0"]}).json()
        assert result["nodenames"] == []
        assert result["failedNodes"]["node-0"] == "1 GPU needed, 0 can take the share now"
        assert "error" in bind(http, "too-big", "node-0")
        assert passes(http, fits, "node-0")
    with ExtenderServer(Extender(api)) as http:  # re-read from the pods: the memory still held
        assert not passes(http, too_big, "node-0")
        assert passes(http, fits, "node-0")
