"""The committed gRPC modules are what grpcio-tools generates from api.proto today."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpc_tools import protoc

from gpupool.k8s.proto import api_pb2

SRC = Path(__file__).resolve().parents[2] / "src"
PROTO = Path("gpupool/k8s/proto/api.proto")
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def test_regenerating_the_stubs_gives_the_committed_files(tmp_path: Path) -> None:
    (tmp_path / PROTO).parent.mkdir(parents=True)
    shutil.copy(SRC / PROTO, tmp_path / PROTO)
    args = ["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    args += [f"--grpc_python_out={tmp_path}", str(tmp_path / PROTO)]
    assert protoc.main(args) == 0
    for name in GENERATED:
        fresh = (tmp_path / PROTO.parent / name).read_text()
        assert fresh == (SRC / PROTO.parent / name).read_text(), f"{name}: run `make proto`"


def test_the_services_and_messages_carry_the_kubelet_names() -> None:
    services = api_pb2.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    allocate = api_pb2.ContainerAllocateResponse.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in allocate.items()} == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
    }
