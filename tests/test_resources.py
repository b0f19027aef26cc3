"""core.resources: requests validate themselves."""

import pytest

from gpupool.core.errors import InvalidRequest
from gpupool.core.resources import Mode, NodeSpec, Request


def test_fractional_request() -> None:
    req = Request(gpus=1, compute=300, cpu=4000, gpu_models=("T4", "P100"))
    assert req.is_fractional
    assert req.total_gpu_milli == 300
    assert req.allows_model("T4") and not req.allows_model("G2")
    assert Request(gpus=2).total_gpu_milli == 2000
    assert Request(gpus=0, cpu=1000).total_gpu_milli == 0
    assert Request(gpus=1).allows_model("anything")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpus": -1},
        {"gpus": 1, "compute": 0},
        {"gpus": 1, "compute": 1500},
        {"gpus": 2, "compute": 500},
        {"gpus": 1, "memory": -5},
        {"gpus": 1, "cpu": -1},
        {"gpus": 1, "compute": 500, "mode": Mode.EXCLUSIVE},
        {"gpus": 1, "mig_profile": "1g.10gb"},
        {"gpus": 1.5},
    ],
)
def test_bad_requests(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        Request(**kwargs)  # type: ignore[arg-type]


def test_node_spec_validates() -> None:
    NodeSpec("n0", cpu=64000, host_memory=1 << 30, gpu_count=8, gpu_model="G2")
    with pytest.raises(InvalidRequest):
        NodeSpec("n0", cpu=-1, host_memory=0, gpu_count=0)
