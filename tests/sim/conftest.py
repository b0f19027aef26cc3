"""Shared fixtures of the simulator tests: small trace files written to a temporary folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
NODES = "n0,64000,262144,2,P100\nn1,96000,786432,8,G2\n"
PODS = (
    "p2,4000,15258,1,220,,BE,Running,0,10,0\n"
    "p0,12000,16384,1,1000,,LS,Running,0,10,0\n"
    "p1,88000,327680,8,1000,V100M16|V100M32,LS,Running,0,10,0\n"
    "p3,8000,30517,0,0,,BE,Running,0,10,0\n"
)

TraceWriter = Callable[..., Path]


@pytest.fixture
def write_trace(tmp_path: Path) -> TraceWriter:
    """Write a trace folder (csv/ inside) and return its path; rows replace the defaults
    (two nodes, four pods: fractional, whole, 8-GPU with a model list, CPU-only)."""

    def write(
        nodes: str = NODES, pods: str = PODS, workload: str = "default", extra_pods: str = ""
    ) -> Path:
        folder = tmp_path / "trace" / "csv"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "openb_node_list_gpu_node.csv").write_text(NODE_HEADER + nodes)
        (folder / f"openb_pod_list_{workload}.csv").write_text(POD_HEADER + pods + extra_pods)
        return tmp_path / "trace"

    return write
