"""The kubelet device plugin (API v1beta1 over gRPC on Unix sockets).

Each GPU is advertised as SLOTS_PER_GPU slots of `gpupool.io/gpu`; a pod takes one slot per GPU
it shares. Which GPUs and slots a pod gets was decided by the extender and written, signed, on
the pod. The kubelet names no pod in GetPreferredAllocation or Allocate: the extender lets one
pod per GPU count wait for its Allocate on a node, so the allocation size names the pod;
GetPreferredAllocation steers the kubelet to that pod's slots, and Allocate serves only the pod
whose slots are the device IDs it is given, whose signature holds, when no other pod of that size
waits: else it fails (FAILED_PRECONDITION) rather than guess. The answer is the share's
environment and read-only files. Health comes from the devices layer; a kubelet
restart (its socket re-created, or ours removed) makes the plugin serve and register again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpupool.agent.arbiters import NodeArbiter
from gpupool.core.errors import GpupoolError, InvalidRequest, KubeApiError
from gpupool.devices.backend import GpuBackend
from gpupool.isolation.arbiter_control import ANY_UID, Registration, node_arbiter_dir
from gpupool.isolation.launch import ShareLimits
from gpupool.k8s import hostfiles, inventory, names
from gpupool.k8s.allocation import ShareFiles, container_share
from gpupool.k8s.inventory import GpuInfo
from gpupool.k8s.kubeapi import KubeApi, Obj
from gpupool.k8s.podshare import (
    Allocation,
    allocated_mark,
    read_allocation,
    slot_gpu,
    slot_id,
    waiting,
)
from gpupool.k8s.podspec import container_owner, gpu_count, pod_key
from gpupool.k8s.proto import api_pb2 as pb
from gpupool.k8s.proto import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
PLUGIN_SOCKET = "gpupool.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


class AllocateRefused(GpupoolError):
    """Allocate cannot serve a request: no pod, or more than one, it can be for; or the pod's
    allocation is not the extender's."""


def _socket_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


class DevicePlugin:
    """One node's plugin: inventory, gRPC server, registration, and the pods it allocates."""

    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        backend: GpuBackend,
        kubelet_dir: Path,
        files: ShareFiles,
        key: bytes,
    ) -> None:
        self.api = api
        #: the extender's signing key: only what it wrote for a pod is served
        self.key = key
        self.node_name = node_name
        self.backend = backend
        self.kubelet_dir = kubelet_dir
        self.files = files
        simulated = backend.simulated_node()
        self.sim_node = simulated.directory if simulated is not None else None
        #: the node's compute arbiter, the host's shares' too (one per GPU per node)
        self.arbiter = NodeArbiter(node_arbiter_dir(self.sim_node), files.state_dir)
        self._arbitrated: dict[str, Registration] = {}
        self.gpus: list[GpuInfo] = []
        self._changed = threading.Condition()
        self._version = 0
        self._published: str | None = None
        self._server: grpc.Server | None = None
        self._kubelet_id: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._alloc_lock = threading.Lock()

    @property
    def socket(self) -> Path:
        return self.kubelet_dir / PLUGIN_SOCKET

    # -- inventory and health -------------------------------------------------------------------

    def refresh(self) -> None:
        """Read the GPUs now; tell the kubelet and the API server when anything changed."""
        gpus = inventory.from_snapshot(self.backend.snapshot())
        with self._changed:
            if gpus != self.gpus:
                self.gpus = gpus
                self._version += 1
                self._changed.notify_all()
        self._publish()

    def _publish(self) -> None:
        text = inventory.encode(self.gpus)
        if text == self._published:
            return
        try:
            self.api.patch_node_annotations(self.node_name, {names.ANN_NODE_GPUS: text})
            self._published = text
        except KubeApiError as err:
            log.warning(
                "GPU inventory not published on node %s yet (--node-name or $NODE_NAME must be "
                "the Node object's name): %s",
                self.node_name,
                err,
            )

    def devices(self) -> list[Any]:
        return [
            pb.Device(ID=slot_id(g.uuid, s), health=HEALTHY if g.healthy else UNHEALTHY)
            for g in self.gpus
            for s in range(names.SLOTS_PER_GPU)
        ]

    def watch_devices(self, context: grpc.ServicerContext) -> Iterator[Any]:
        seen = -1
        while context.is_active() and not self._stop.is_set():
            with self._changed:
                if self._version == seen:
                    self._changed.wait(timeout=0.5)
                if self._version == seen:
                    continue
                seen = self._version
                devices = self.devices()
            yield pb.ListAndWatchResponse(devices=devices)

    # -- serving and registration ---------------------------------------------------------------

    def serve(self) -> None:
        """(Re)start the gRPC server on our socket and register with the kubelet."""
        self._stop_server()
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_DevicePluginServicer_to_server(_Service(self), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        self._kubelet_id = _socket_id(self.kubelet_dir / KUBELET_SOCKET)
        self.register()

    def register(self) -> None:
        target = f"unix://{self.kubelet_dir / KUBELET_SOCKET}"
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=PLUGIN_SOCKET,
            resource_name=names.RESOURCE_GPU,
            options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        try:
            with grpc.insecure_channel(target) as channel:
                stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                stub.Register(request, timeout=5)
        except grpc.RpcError as err:
            raise KubeApiError(f"registration with the kubelet at {target} failed: {err}") from err
        log.info("registered %s with the kubelet at %s", names.RESOURCE_GPU, target)

    def kubelet_restarted(self) -> bool:
        """The kubelet re-creates its socket and removes ours when it restarts."""
        now = _socket_id(self.kubelet_dir / KUBELET_SOCKET)
        return now is not None and (now != self._kubelet_id or not self.socket.exists())

    def run(self, interval: float = 1.0, collect_every: int = 60) -> None:
        """Serve until stop(): refresh health, serve again after a kubelet restart, and every
        `collect_every` rounds remove the files of containers whose pods are gone."""
        rounds = 0
        while not self._stop.is_set():
            try:
                self.refresh()
                self.arbiter.keep(lambda: list(self._arbitrated.values()))
                if self._server is None or self.kubelet_restarted():
                    self.serve()
                rounds += 1
                if rounds % collect_every == 0:
                    self.collect_garbage()
            except GpupoolError as err:
                log.warning("%s (retrying in %.0f s)", err, interval)
            self._stop.wait(interval)

    def collect_garbage(self) -> None:
        """Remove the shim.conf and region of every container whose pod left this node, and
        the library directories of earlier versions that no container uses any more."""
        alive = {_share_key(pod) for pod in self.api.list_pods_on_node(self.node_name)}
        for key in self.files.keys() - alive:
            self.files.release(key)
        for path in hostfiles.prune(self.files.lib_dir, self.files.libraries_allocated()):
            log.info("removed %s: no container uses it", path)
        for key in set(self._arbitrated) - alive:
            registration = self._arbitrated.pop(key)
            try:
                self.arbiter.unregister(registration.share.share_id)
            except GpupoolError as err:
                log.warning("pod %s: %s", key, err)

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._stop_server()

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    # -- allocation -----------------------------------------------------------------------------

    def _target(self, size: int) -> tuple[Obj, Allocation]:
        """The one pod this Allocate of `size` slots can be for, and its verified allocation."""
        pods = [
            pod
            for pod in self.api.list_pods_on_node(self.node_name)
            if gpu_count(pod) == size and waiting(pod, self.key)
        ]
        if not pods:
            raise AllocateRefused(
                f"no pod bound to {self.node_name} by the gpupool extender waits for {size} "
                f"GPU(s): was it scheduled by {names.SCHEDULER_NAME}?"
            )
        if len(pods) > 1:
            both = ", ".join(sorted(pod_key(p) for p in pods))
            raise AllocateRefused(
                f"cannot tell which pod this Allocate is for: {both} all wait for {size} GPU(s) "
                f"on {self.node_name}"
            )
        try:
            allocation = read_allocation(pods[0], self.key)
        except InvalidRequest as err:
            raise AllocateRefused(str(err)) from err
        if allocation.node != self.node_name:
            raise AllocateRefused(
                f"pod {pod_key(pods[0])} was placed on {allocation.node}, not {self.node_name}"
            )
        return pods[0], allocation

    def allocate_one(self, devices: list[str]) -> Any:
        with self._alloc_lock:
            pod, allocation = self._target(len(devices))
            if sorted(devices) != sorted(allocation.slots):
                raise AllocateRefused(
                    f"the kubelet allocates {','.join(sorted(devices))}; pod {pod_key(pod)} was "
                    f"given {','.join(allocation.slots)} by the extender"
                )
            response = self._share_response(pod, allocation)
            meta = pod["metadata"]
            self.api.patch_pod_annotations(
                meta.get("namespace") or "default",
                meta["name"],
                allocation.uid,
                {names.ANN_ALLOCATED: allocated_mark(self.key, allocation)},
            )
        return response

    def _share_response(self, pod: Obj, allocation: Allocation) -> Any:
        by_index = {g.index: g for g in self.gpus}
        try:
            gpus = [by_index[i] for i in allocation.gpus]
            for gpu, slot in zip(gpus, allocation.slots, strict=True):
                if slot_gpu(slot) != gpu.uuid:
                    raise ValueError(f"slot {slot} is not on GPU {gpu.index} ({gpu.uuid})")
            # the pod's priority is its compute arbiter priority, as a daemon job's is
            limits = ShareLimits(
                allocation.gpus,
                allocation.memory,
                allocation.compute,
                priority=allocation.priority,
            )
            owner = container_owner(pod)
        except (KeyError, ValueError, GpupoolError) as err:
            raise AllocateRefused(f"pod {pod_key(pod)}: bad gpupool allocation: {err}") from err
        key = _share_key(pod)
        seat = None
        if limits.arbitrated:
            # a container's uid is its image's: the pod is known by its key, which only its
            # container's read-only settings hold
            name = self.arbiter.share_of(f"pod {key}")
            registration = limits.registration(name, ANY_UID, {g.index: g.uuid for g in gpus})
            try:
                self.arbiter.register(registration)
                self._arbitrated[key] = registration
                seat = (self.arbiter.directory, name)
            except GpupoolError as err:
                log.warning("pod %s runs unarbitrated: %s", pod_key(pod), err)
        share = container_share(self.files, key, limits, gpus, self.sim_node, owner, seat)
        mounts = [
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in share.mounts
        ]
        return pb.ContainerAllocateResponse(envs=share.envs, mounts=mounts)

    def steered(self, available: list[str], must: list[str], size: int) -> list[str] | None:
        """The slots of the one pod waiting for `size` slots, if the kubelet offers them."""
        try:
            _, allocation = self._target(size)
        except GpupoolError as err:
            log.warning("GetPreferredAllocation: %s", err)
            return None
        offered = set(available) | set(must)
        return list(allocation.slots) if set(allocation.slots) <= offered else None

    def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        """The waiting pod's slots; else slots on distinct GPUs, those that must be included
        first (an Allocate of them is then refused, unless they are a waiting pod's)."""
        steered = self.steered(available, must, size)
        if steered is not None:
            return steered
        chosen = list(must)
        used = {d.split("::")[0] for d in chosen}
        for device in available:
            if len(chosen) >= size:
                break
            gpu = device.split("::")[0]
            if device not in chosen and gpu not in used:
                chosen.append(device)
                used.add(gpu)
        for device in available:
            if len(chosen) >= size:
                break
            if device not in chosen:
                chosen.append(device)
        return chosen


class _Service(pb_grpc.DevicePluginServicer):
    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        yield from self.plugin.watch_devices(context)

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        responses = [
            pb.ContainerPreferredAllocationResponse(
                deviceIDs=self.plugin.preferred(
                    list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size
                )
            )
            for r in request.container_requests
        ]
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            responses = [
                self.plugin.allocate_one(list(r.devicesIDs)) for r in request.container_requests
            ]
        except AllocateRefused as err:
            log.warning("Allocate refused: %s", err)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except GpupoolError as err:
            log.warning("Allocate failed: %s", err)
            context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.PreStartContainerResponse()


def _share_key(pod: Obj) -> str:
    """The name of a container's files: its pod's UID."""
    return str(pod["metadata"].get("uid") or pod_key(pod).replace("/", "_"))


def default_node_name() -> str:
    """The node this plugin runs on: $NODE_NAME (the DaemonSet sets it), else the host name."""
    return os.environ.get("NODE_NAME") or os.uname().nodename
