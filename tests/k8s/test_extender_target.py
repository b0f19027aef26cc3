"""The extender's target workload: learnt from the pods it binds, shown by /debug/placement, and
taken up by the policy once it has moved."""

from __future__ import annotations

from k8s_support import ExtenderServer, bind, gpu_pod

from gpupool.core.units import GiB
from gpupool.k8s import names
from gpupool.k8s.extender import Extender
from gpupool.k8s.fleet import TARGET_EVERY
from gpupool.k8s.inventory import GpuInfo, encode
from gpupool.k8s.kubeapi import InMemoryKube
from gpupool.scheduler.gpupool_policy import GpupoolPolicy
from gpupool.scheduler.recent import TARGET_MOVED, moved
from gpupool.scheduler.workload import PRIOR, PodSpec, TargetWorkload, Widest


def target_of(extender: Extender) -> TargetWorkload:
    """The target workload the extender's policy scores against now."""
    policy = extender.fleet.policy("gpupool")
    assert isinstance(policy, GpupoolPolicy)
    return policy.target


def test_bound_pods_become_the_target_the_policy_scores_against() -> None:
    api = InMemoryKube()
    inventory = [GpuInfo(i, f"GPU-{i}", "H100", 80 * GiB) for i in range(8)]
    for n in range(TARGET_EVERY // 4 + 1):
        api.add_node(f"node-{n}", {names.ANN_NODE_GPUS: encode(inventory)})
    for i in range(TARGET_EVERY):
        api.add_pod(gpu_pod(f"p{i}", gpus="2", annotations={names.ANN_MODE: "exclusive"}))
    extender = Extender(api)
    with ExtenderServer(extender) as http:
        before = http.get("/debug/placement").json()
        assert before["policy"] == "gpupool" and before["nodes"] == TARGET_EVERY // 4 + 1
        assert [s["gpu_milli"] for s in before["target_workload"]] == [
            spec.gpu_milli for spec in PRIOR.specs
        ]
        assert [s.get("gpu_value") for s in before["target_workload"]] == [0.25, 0.5, None]
        http.post("/filter", json={"pod": api.pods[("default", "p0")], "nodenames": ["node-0"]})
        assert target_of(extender).specs == PRIOR.specs
        for i in range(TARGET_EVERY):
            assert bind(http, f"p{i}", f"node-{i // 4}") == {}
            api.pods[("default", f"p{i}")]["status"] = {"phase": "Running"}  # admitted
        after = http.get("/debug/placement").json()["target_workload"]
    assert after[0]["gpus"] == 2 and after[0]["probability"] > 0.5
    assert target_of(extender).specs[0].gpus == 2


def test_a_target_moves_when_a_probability_does_not_when_only_the_order_does() -> None:
    a, b, c = PRIOR.specs
    wide = PodSpec(0, 1000, 8, ())
    old = TargetWorkload((a, b, c), (0.40, 0.39, 0.21))
    # b overtakes a, and a rare shape comes in: the same mix as far as placement goes
    d = PodSpec(0, 300, 1, ())
    assert not moved(old, TargetWorkload((b, a, c, d), (0.41, 0.38, 0.19, 0.02)))
    # a shape's probability moved by more than TARGET_MOVED: a new target
    assert moved(old, TargetWorkload((a, b, c), (0.40 + TARGET_MOVED + 0.01, 0.33, 0.21)))
    assert moved(old, TargetWorkload((a, b, d), (0.40, 0.39, 0.21)))  # c gone, d came
    # the widest shape changed, however rare (the reserve for the widest pods keys on it)
    wider = TargetWorkload((a, b, c, wide), (0.40, 0.38, 0.21, 0.01), widest=Widest(8, 0))
    assert moved(old, wider)
