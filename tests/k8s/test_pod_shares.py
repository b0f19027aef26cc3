"""Each container gets its own pod's share, whatever the kubelet's order; no forged share is served.

End to end: the extender over real HTTP binds pods in the in-memory API server, the test kubelet
admits them over the real device-plugin gRPC (GetPreferredAllocation, then Allocate of what it
preferred), and the answers are checked against what each pod was placed with.
"""

from __future__ import annotations

import copy
import itertools
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from k8s_support import (
    KEY,
    ExtenderServer,
    TestKubelet,
    bind,
    build_shim_client,
    gpu_pod,
    serving,
    socket_dir,
    wait_for,
)

from gpupool.core.units import GiB
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.isolation.arbiter import SOCKET as ARBITER_SOCKET
from gpupool.k8s import hostfiles, names
from gpupool.k8s.allocation import ShareFiles
from gpupool.k8s.deviceplugin import DevicePlugin
from gpupool.k8s.extender import Extender
from gpupool.k8s.kubeapi import InMemoryKube
from gpupool.k8s.podspec import gpu_count


@pytest.fixture
def api() -> InMemoryKube:
    kube = InMemoryKube()
    kube.add_node("gpu-1")
    return kube


@pytest.fixture
def plugin(
    api: InMemoryKube, sockets: Path, kubelet: TestKubelet, tmp_path: Path
) -> Iterator[DevicePlugin]:
    backend = SimulatedBackend.open("4xA100-80GB", tmp_path / "node")
    files = ShareFiles(tmp_path / "state", hostfiles.install(tmp_path / "lib"))
    with serving(DevicePlugin(api, "gpu-1", backend, sockets, files, KEY), kubelet) as plugin:
        wait_for(lambda: names.ANN_NODE_GPUS in api.nodes["gpu-1"]["metadata"]["annotations"])
        yield plugin
    backend.close()


@pytest.fixture
def http(api: InMemoryKube, plugin: DevicePlugin) -> Iterator[Any]:
    with ExtenderServer(Extender(api, key=KEY)) as client:
        yield client


def conf_of(response: Any) -> dict[str, str]:
    """The settings the container's /etc/gpupool/shim.conf holds."""
    mount = next(m for m in response.mounts if m.container_path.endswith("shim.conf"))
    lines = Path(mount.host_path).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def check_own_share(
    api: InMemoryKube, plugin: DevicePlugin, kubelet: TestKubelet, name: str, response: Any
) -> None:
    """The container got the share its pod was placed with, on the slots chosen for it."""
    ann = api.pods[("default", name)]["metadata"]["annotations"]
    assert kubelet.last_devices == ann[names.ANN_SLOTS].split(",")
    uuids = {g.index: g.uuid for g in plugin.gpus}
    gpus = [int(g) for g in ann[names.ANN_GPUS].split(",")]
    assert [d.split("::")[0] for d in kubelet.last_devices] == [uuids[g] for g in gpus]
    conf = conf_of(response)
    for ordinal in range(len(gpus)):
        assert conf[f"GPUPOOL_MEMORY_LIMIT_{ordinal}"] == ann[names.ANN_MEMORY_BYTES]
    assert conf["GPUPOOL_COMPUTE_LIMIT"] == str(int(ann[names.ANN_COMPUTE_MILLI]) // 10)
    assert response.envs["CUDA_VISIBLE_DEVICES"] == ann[names.ANN_GPUS]


SHARES = {1: ("20Gi", "60"), 2: ("10Gi", "30"), 3: ("5Gi", "10")}


@pytest.mark.parametrize("order", list(itertools.permutations(SHARES)))
def test_pods_admitted_in_any_order_get_their_own_shares(
    api: InMemoryKube,
    plugin: DevicePlugin,
    kubelet: TestKubelet,
    http: Any,
    order: tuple[int, ...],
) -> None:
    # bound in one order (by size), admitted in another
    for size, (memory, compute) in SHARES.items():
        api.add_pod(gpu_pod(f"p{size}", gpus=str(size), memory=memory, compute=compute))
        assert bind(http, f"p{size}") == {}
    for size in order:
        response = kubelet.admit(size)
        check_own_share(api, plugin, kubelet, f"p{size}", response)
        assert conf_of(response)["GPUPOOL_MEMORY_LIMIT_0"] == str({1: 20, 2: 10, 3: 5}[size] * GiB)


def test_a_second_pod_of_a_size_waits_until_the_first_is_admitted(
    api: InMemoryKube, plugin: DevicePlugin, kubelet: TestKubelet, http: Any
) -> None:
    """The issue's swap: p1 (20Gi/60 %) and p2 (10Gi/30 %), bound p2 first, admitted p1 first.
    The kubelet cannot admit p1 before it is bound, and p1 is bound only once p2 is admitted."""
    api.add_pod(gpu_pod("p1", memory="20Gi", compute="60"))
    api.add_pod(gpu_pod("p2", memory="10Gi", compute="30"))
    assert bind(http, "p2") == {}
    refused = bind(http, "p1")
    assert refused == {
        "error": "node gpu-1: pod default/p2 (1 GPU(s)) waits for the kubelet to admit it; "
        "one such pod per node at a time, retry shortly"
    }
    assert names.ANN_GPUS not in api.pods[("default", "p1")]["metadata"]["annotations"]
    check_own_share(api, plugin, kubelet, "p2", kubelet.admit(1))
    assert bind(http, "p1") == {}  # kube-scheduler's retry
    check_own_share(api, plugin, kubelet, "p1", kubelet.admit(1))


def forge(api: InMemoryKube, name: str, annotations: dict[str, str]) -> None:
    """A pod created with spec.nodeName (skipping the scheduler) and annotations of its own."""
    pod = gpu_pod(name, memory="1Gi", annotations=annotations)
    pod["spec"]["nodeName"] = "gpu-1"
    api.add_pod(pod)


def refused(kubelet: TestKubelet, size: int = 1) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        kubelet.admit(size)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return str(caught.value.details())


def test_forged_annotations_with_a_node_name_get_no_share(
    api: InMemoryKube, plugin: DevicePlugin, kubelet: TestKubelet
) -> None:
    uuid = plugin.gpus[0].uuid
    forged = {
        names.ANN_NODE: "gpu-1",
        names.ANN_GPUS: "0",
        names.ANN_SLOTS: f"{uuid}::0",
        names.ANN_MEMORY_BYTES: str(80 * GiB),
        names.ANN_COMPUTE_MILLI: "1000",
        "gpupool.io/bind-time": "0",
    }
    for signature in (None, "0" * 64):
        name = f"forged-{0 if signature is None else 1}"
        forge(
            api, name, forged if signature is None else {**forged, names.ANN_SIGNATURE: signature}
        )
        assert refused(kubelet) == (
            f"pod default/{name}: its gpupool allocation was not written by the gpupool extender "
            "for this pod (forged or copied annotations, or the pod was re-created with a new "
            "UID): refused"
        )
        assert names.ANN_ALLOCATED not in api.pods[("default", name)]["metadata"]["annotations"]
        api.pods[("default", name)]["status"] = {"phase": "Failed"}  # as the kubelet marks it
    assert plugin.files.keys() == set()


@pytest.mark.parametrize("mark_served", [False, True])
def test_a_pod_with_copied_annotations_cannot_take_a_waiting_pods_share(
    api: InMemoryKube, plugin: DevicePlugin, kubelet: TestKubelet, http: Any, mark_served: bool
) -> None:
    """A bind-time of 0 once won the allocation meant for another pod; now the copy, and even a
    forged 'served' mark, leaves the plugin unable to tell the pods apart: it serves neither."""
    api.add_pod(gpu_pod("victim", memory="30Gi", compute="50"))
    assert bind(http, "victim") == {}
    copied = dict(api.pods[("default", "victim")]["metadata"]["annotations"])
    copied["gpupool.io/bind-time"] = "0"
    if mark_served:
        copied[names.ANN_ALLOCATED] = "true"
    forge(api, "thief", copied)
    assert refused(kubelet) == (
        "cannot tell which pod this Allocate is for: default/thief, default/victim all wait for "
        "1 GPU(s) on gpu-1"
    )
    assert plugin.files.keys() == set()
    api.pods[("default", "thief")]["status"] = {"phase": "Failed"}  # the kubelet's rejection
    check_own_share(api, plugin, kubelet, "victim", kubelet.admit(1))
    # once the victim runs, the copy alone is still not a share
    forge(api, "thief-2", copied)
    assert "not written by the gpupool extender for this pod" in refused(kubelet)


def test_a_pod_recreated_with_a_new_uid_is_refused(
    api: InMemoryKube, plugin: DevicePlugin, kubelet: TestKubelet, http: Any
) -> None:
    api.add_pod(gpu_pod("p", memory="10Gi"))
    assert bind(http, "p") == {}
    pod = copy.deepcopy(api.pods[("default", "p")])
    pod["metadata"]["uid"] = "uid-recreated"
    api.add_pod(pod)  # same name, same annotations, a new object
    assert "or the pod was re-created with a new UID" in refused(kubelet)


def test_an_allocate_of_other_slots_than_the_pods_is_refused(
    api: InMemoryKube, plugin: DevicePlugin, kubelet: TestKubelet, http: Any
) -> None:
    """A kubelet that ignores GetPreferredAllocation: the devices name no pod, nothing served."""
    api.add_pod(gpu_pod("p", memory="10Gi"))
    assert bind(http, "p") == {}
    chosen = api.pods[("default", "p")]["metadata"]["annotations"][names.ANN_SLOTS]
    other = next(d for d, _ in kubelet.latest_devices() if d != chosen)
    assert kubelet.plugin is not None
    from gpupool.k8s.proto import api_pb2 as pb

    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devicesIDs=[other])]
    )
    with pytest.raises(grpc.RpcError) as caught:
        kubelet.plugin.Allocate(request)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert str(caught.value.details()) == (
        f"the kubelet allocates {other}; pod default/p was given {chosen} by the extender"
    )
    assert names.ANN_ALLOCATED not in api.pods[("default", "p")]["metadata"]["annotations"]


def test_the_region_directory_is_the_container_users_alone(
    api: InMemoryKube, plugin: DevicePlugin, kubelet: TestKubelet, http: Any
) -> None:
    pod = gpu_pod("p", memory="10Gi", compute="30")
    pod["spec"]["securityContext"] = {"runAsUser": 1234, "runAsGroup": 2345}
    api.add_pod(pod)
    assert bind(http, "p") == {}
    response = kubelet.admit(1)
    region = next(m for m in response.mounts if m.container_path.endswith("/share"))
    st = os.stat(region.host_path)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 2345, 0o770)
    conf = next(m for m in response.mounts if m.container_path.endswith("shim.conf"))
    assert stat.S_IMODE(os.stat(conf.host_path).st_mode) == 0o444
    for parent in (Path(region.host_path).parent, Path(conf.host_path).parent.parent):
        assert stat.S_IMODE(parent.stat().st_mode) == 0o711
    for mount in response.mounts:
        assert not os.stat(mount.host_path).st_mode & stat.S_IWOTH, mount
    # the node's compute arbiter, read-only: its directory and everything in it its own (root's),
    # but the lease socket, which every container's processes connect to
    arbiter = next(m for m in response.mounts if m.container_path.endswith("/arbiter"))
    assert arbiter.read_only and Path(arbiter.host_path) == plugin.arbiter.directory
    found = os.stat(arbiter.host_path)
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (os.geteuid(), 0o755)
    entries = {p.name: p.lstat() for p in Path(arbiter.host_path).iterdir()}
    assert entries.pop(ARBITER_SOCKET).st_mode & 0o777 == 0o666
    assert entries  # its control socket and the GPU's view at least
    for name, entry in entries.items():
        assert entry.st_uid == os.geteuid() and not entry.st_mode & 0o022, name


def test_a_container_running_as_its_user_writes_its_region_and_no_one_else_can(
    sockets: Path, kubelet: TestKubelet
) -> None:
    """Real users: the container's process runs as the pod's runAsUser on the simulated driver,
    with the answer's files, and its share holds; another user cannot write its region."""
    from users import remove_tree, run_as, users, world_dir

    root = world_dir()
    api = InMemoryKube()
    api.add_node("gpu-1")
    backend = SimulatedBackend.open("2xA100-80GB", root / "node")
    files = ShareFiles(
        root / "state", hostfiles.install(root / "lib"), container_root=root / "container"
    )
    plugin = DevicePlugin(api, "gpu-1", backend, sockets, files, KEY)
    try:
        with users(2) as (owner, other):
            client = build_shim_client(root / "shim_client")
            pod = gpu_pod("p", memory="2Gi", compute="50")
            pod["spec"]["securityContext"] = {"runAsUser": owner.uid, "runAsGroup": owner.gid}
            api.add_pod(pod)
            plugin.refresh()
            plugin.serve()
            wait_for(lambda: kubelet.device_lists, what="registration")
            with ExtenderServer(Extender(api, key=KEY)) as http:
                assert bind(http, "p") == {}
            response = kubelet.admit(1)
            # no gRPC threads while processes are forked as other users (a child forked beside
            # them has been seen to crash before its exec)
            plugin.stop()
            kubelet.stop()
            for mount in response.mounts:  # the runtime's mounts, as links
                target = Path(mount.container_path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(mount.host_path)
            library = next(m for m in response.mounts if m.container_path.endswith(".so"))
            conf = next(m for m in response.mounts if m.container_path.endswith("shim.conf"))
            env = {
                **response.envs,
                "LD_PRELOAD": library.container_path,
                "GPUPOOL_CONFIG_FILE": conf.container_path,
            }
            done = run_as(owner, [str(client), "alloc", str(3 * GiB), "alloc", str(GiB)], env=env)
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines() == ["alloc 2", "alloc 0"]  # 2: out of memory
            region = next(m for m in response.mounts if m.container_path.endswith("/share"))
            written = [p for p in Path(region.host_path).iterdir()]
            assert written and all(p.stat().st_uid == owner.uid for p in written)
            intruder = run_as(other, ["touch", f"{region.host_path}/x"])
            assert intruder.returncode != 0 and "Permission denied" in intruder.stderr
    finally:
        plugin.stop()
        backend.close()
        remove_tree(root)


def test_twelve_pods_on_two_nodes_each_on_its_own_slots_and_the_thirteenth_refused(
    tmp_path: Path,
) -> None:
    """The issue's scene: two simulated 2x A100 nodes, each with its plugin and its kubelet;
    pods of 1 and 2 GPUs go through filter, prioritize and bind, each kubelet admits what waits
    on its node in a shuffled order; every container's share and slots are its own pod's."""
    import random

    from test_extender import schedule

    rng = random.Random(7)
    api = InMemoryKube()
    nodes: dict[str, tuple[TestKubelet, DevicePlugin, SimulatedBackend, Path]] = {}
    try:
        for name in ("node-a", "node-b"):
            api.add_node(name)
            sockets = socket_dir()
            kubelet = TestKubelet(sockets).start()
            backend = SimulatedBackend.open("2xA100-80GB", tmp_path / name)
            files = ShareFiles(tmp_path / f"{name}-state", hostfiles.install(tmp_path / "lib"))
            plugin = DevicePlugin(api, name, backend, sockets, files, KEY)
            plugin.refresh()
            plugin.serve()
            wait_for(lambda k=kubelet: k.device_lists, what="registration")
            nodes[name] = (kubelet, plugin, backend, sockets)
        asks = [("1", "10Gi", "20"), ("2", "8Gi", "10"), ("1", "30Gi", "40"), ("1", "5Gi", "10")]
        pods = [gpu_pod(f"p{i}", *asks[i % len(asks)]) for i in range(12)]
        pods.append(gpu_pod("p12", "2", "60Gi", "50"))  # more than any node has left
        served: dict[str, Any] = {}

        def admit_all(node: str) -> None:
            kubelet, plugin, _, _ = nodes[node]
            waiting = [
                p["metadata"]["name"]
                for p in api.list_pods_on_node(node)
                if p["metadata"]["name"] not in served
            ]
            rng.shuffle(waiting)
            for name in waiting:
                served[name] = kubelet.admit(gpu_count(api.pods[("default", name)]))
                check_own_share(api, plugin, kubelet, name, served[name])
                api.pods[("default", name)]["status"] = {"phase": "Running"}

        with ExtenderServer(Extender(api, key=KEY)) as http:
            for pod in pods:
                api.add_pod(pod)
                placed_on = None
                for _ in range(3):  # kube-scheduler's retries, while the kubelets admit
                    placed_on = schedule(
                        http, api.pods[("default", pod["metadata"]["name"])], list(nodes)
                    )
                    if placed_on is not None:
                        break
                    for node in nodes:
                        admit_all(node)
                if pod["metadata"]["name"] == "p12":
                    assert placed_on is None
                else:
                    assert placed_on is not None, pod["metadata"]["name"]
            args = {"pod": api.pods[("default", "p12")], "nodenames": list(nodes)}
            why = http.post("/filter", json=args).json()
        for node in nodes:
            admit_all(node)
        assert len(served) == 12
        assert why["nodenames"] == [] and set(why["failedNodes"]) == set(nodes)
        # no GPU over-committed, every slot held once
        memory: dict[tuple[str, str], int] = {}
        slots: list[tuple[str, str]] = []  # per node: the kubelet's IDs are the node's
        for pod in api.pods.values():
            ann = pod["metadata"]["annotations"]
            if pod["spec"].get("nodeName") is None:
                continue
            for gpu in ann[names.ANN_GPUS].split(","):
                key = (pod["spec"]["nodeName"], gpu)
                memory[key] = memory.get(key, 0) + int(ann[names.ANN_MEMORY_BYTES])
            slots.extend((pod["spec"]["nodeName"], s) for s in ann[names.ANN_SLOTS].split(","))
        assert max(memory.values()) <= 80 * GiB
        assert len(slots) == len(set(slots))
    finally:
        for kubelet, plugin, backend, sockets in nodes.values():
            plugin.stop()
            kubelet.stop()
            backend.close()
            shutil.rmtree(sockets, ignore_errors=True)
