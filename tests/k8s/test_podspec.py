"""Reading what a pod asks for: Kubernetes quantities, percent, annotations, bad input."""

from __future__ import annotations

import pytest
from k8s_support import gpu_pod

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Mode, Priority
from gpupool.core.units import GiB
from gpupool.k8s import names
from gpupool.k8s.podspec import GpuAsk, gpu_ask


def test_a_share_with_annotations() -> None:
    pod = gpu_pod(
        "p",
        "2",
        "10Gi",
        "100",
        {names.ANN_PRIORITY: "low", names.ANN_GPU_MODEL: "A100-80GB"},
    )
    assert gpu_ask(pod) == GpuAsk(2, 10 * GiB, 1000, Mode.SHIM, Priority.LOW, "A100-80GB")


def test_decimal_quantities_follow_kubernetes() -> None:
    ask = gpu_ask(gpu_pod("p", memory="4G", compute="30"))
    assert ask is not None and (ask.memory, ask.compute) == (4 * 10**9, 300)


def test_no_gpupool_resource_is_no_ask() -> None:
    assert gpu_ask({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c"}]}}) is None


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (gpu_pod("p", memory="-4Gi"), "must not be negative"),
        (gpu_pod("p", memory="4Gx"), "unknown unit"),
        (gpu_pod("p", compute="0"), "must be 1..100 percent"),
        (gpu_pod("p", compute="30%"), "a whole percent 1..100"),
        (gpu_pod("p", gpus="-1"), "a whole number of GPUs"),
        (gpu_pod("p", annotations={names.ANN_MODE: "magic"}), "use one of shim, mps"),
        (
            gpu_pod("p", compute="50", annotations={names.ANN_MODE: "exclusive"}),
            "mode exclusive takes whole GPUs",
        ),
    ],
)
def test_bad_input_is_one_line(pod: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        gpu_ask(pod)


def test_memory_without_gpus_is_refused() -> None:
    pod = gpu_pod("p", memory="1Gi")
    del pod["spec"]["containers"][0]["resources"]["limits"][names.RESOURCE_GPU]
    with pytest.raises(InvalidRequest, match=r"need gpupool\.io/gpu"):
        gpu_ask(pod)
