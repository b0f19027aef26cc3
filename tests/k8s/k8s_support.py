"""A test kubelet speaking the real device-plugin gRPC, a device plugin serving it, and the
extender served over real HTTP."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import uvicorn

from gpupool.k8s import names
from gpupool.k8s.deviceplugin import DevicePlugin
from gpupool.k8s.extender import Extender
from gpupool.k8s.extender_http import create_app
from gpupool.k8s.proto import api_pb2 as pb
from gpupool.k8s.proto import api_pb2_grpc as pb_grpc

#: the allocation key the tests' extenders and device plugins share (the Secret's)
KEY = b"k" * 48
REPO = Path(__file__).resolve().parents[2]


def wait_for(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class TestKubelet(pb_grpc.RegistrationServicer):
    """The kubelet's side: a Registration server on kubelet.sock; on Register it dials the
    plugin's socket and keeps a ListAndWatch stream open, as the kubelet's device manager does."""

    __test__ = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.registrations: list[Any] = []
        self.device_lists: list[list[tuple[str, str]]] = []
        #: slots of the containers admitted, and of the last one
        self.held: set[str] = set()
        self.last_devices: list[str] = []
        self.plugin: pb_grpc.DevicePluginStub | None = None
        self._channel: grpc.Channel | None = None
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{directory / 'kubelet.sock'}")

    def start(self) -> TestKubelet:
        self._server.start()
        return self

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        assert request.version == "v1beta1"
        self.registrations.append(request)
        channel = grpc.insecure_channel(f"unix://{self.directory / request.endpoint}")
        self._channel = channel
        self.plugin = pb_grpc.DevicePluginStub(channel)
        stream = self.plugin.ListAndWatch(pb.Empty())
        threading.Thread(target=self._watch, args=(stream,), daemon=True).start()
        return pb.Empty()

    def _watch(self, stream: Any) -> None:
        try:
            for response in stream:
                self.device_lists.append([(d.ID, d.health) for d in response.devices])
        except grpc.RpcError:
            pass  # the plugin or this kubelet went away

    def stop(self) -> None:
        """Stop as a restarting kubelet does: its socket and the plugins' sockets go away."""
        self._server.stop(grace=None).wait()
        if self._channel is not None:
            self._channel.close()
        for sock in self.directory.glob("*.sock"):
            sock.unlink()

    def latest_devices(self) -> list[tuple[str, str]]:
        return self.device_lists[-1] if self.device_lists else []

    def admit(self, size: int) -> Any:
        """Admit a container asking for `size` slots as the kubelet's device manager does:
        GetPreferredAllocation over the healthy slots no container holds, then Allocate of
        what it preferred; the slots are held from then on. Returns the container's answer."""
        assert self.plugin is not None
        free = [d for d, h in self.latest_devices() if h == "Healthy" and d not in self.held]
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=free, allocation_size=size
                )
            ]
        )
        preferred = list(
            self.plugin.GetPreferredAllocation(request).container_responses[0].deviceIDs
        )
        allocate = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devicesIDs=preferred)]
        )
        response = self.plugin.Allocate(allocate).container_responses[0]
        self.held.update(preferred)
        self.last_devices = preferred
        return response


def socket_dir() -> Path:
    """A kubelet's device-plugin directory (short: Unix socket paths are limited to 107)."""
    return Path(tempfile.mkdtemp(prefix="gp-k8s-"))


@contextmanager
def serving(plugin: DevicePlugin, kubelet: TestKubelet) -> Iterator[DevicePlugin]:
    """`plugin` run in a thread as `gpupool k8s device-plugin` runs it, registered with
    `kubelet` and its devices listed; stopped at the end."""
    thread = threading.Thread(target=plugin.run, args=(0.1,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: kubelet.registrations and kubelet.device_lists, what="registration")
        yield plugin
    finally:
        plugin.stop()
        thread.join(5)


def build_shim_client(out: Path) -> Path:
    """tests/native/progs/shim_client.c built at `out`: a container's CUDA program."""
    source = REPO / "tests" / "native" / "progs" / "shim_client.c"
    include = REPO / "native" / "include"
    cmd = ["gcc", "-O2", "-pthread", f"-I{include}", "-o", str(out), str(source), "-ldl"]
    subprocess.run(cmd, check=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ExtenderServer:
    """The extender's FastAPI app under uvicorn on 127.0.0.1, in a thread."""

    def __init__(self, extender: Extender) -> None:
        # as `gpupool k8s extender` does: read the nodes and pods, then serve
        extender.resync()
        extender.start_background(interval=0.2)
        self.extender = extender
        self.port = free_port()
        config = uvicorn.Config(
            create_app(extender), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> httpx.Client:
        self.thread.start()
        wait_for(lambda: self.server.started, what="the extender to listen")
        self.client = httpx.Client(base_url=self.url, timeout=30)
        return self.client

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(10)
        self.extender.stop()


def gpu_pod(
    name: str,
    gpus: str = "1",
    memory: str | None = None,
    compute: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = {names.RESOURCE_GPU: gpus}
    if memory is not None:
        limits[names.RESOURCE_MEMORY] = memory
    if compute is not None:
        limits[names.RESOURCE_COMPUTE] = compute
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": names.SCHEDULER_NAME,
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
        },
    }


def bind(http: httpx.Client, name: str, node: str = "gpu-1") -> dict[str, Any]:
    """The extender's answer to binding pod default/NAME to `node` ({} when bound)."""
    args = {
        "podName": name,
        "podNamespace": "default",
        "podUID": f"uid-default-{name}",
        "node": node,
    }
    answer: dict[str, Any] = http.post("/bind", json=args).json()
    return answer
