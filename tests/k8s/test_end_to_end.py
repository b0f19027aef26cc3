"""A pod from filter to a running share, without a cluster.

The test kubelet speaks the real registration and device-plugin gRPC over Unix sockets, the
extender answers over real HTTP, the API server is the in-memory one, and the container's
process runs on the simulated driver with exactly the environment and files Allocate gave it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
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
    wait_for,
)

from gpupool.core.units import GiB, MiB
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.devices.sim.state import FLAG_LOST
from gpupool.isolation.arbiter import find_share, lease_clients, view_file
from gpupool.isolation.libraries import NATIVE_DIR, SHIM_LIBRARY
from gpupool.k8s import hostfiles, names
from gpupool.k8s.allocation import CONTAINER_CONFIG, CONTAINER_PRELOAD, ShareFiles
from gpupool.k8s.deviceplugin import DevicePlugin
from gpupool.k8s.extender import Extender
from gpupool.k8s.hostfiles import CONTAINER_LIBRARY
from gpupool.k8s.inventory import decode
from gpupool.k8s.kubeapi import InMemoryKube
from gpupool.k8s.proto import api_pb2 as pb

CUDA_OUT_OF_MEMORY = 2
_SCRUB = ("GPUPOOL_", "LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimulatedBackend]:
    backend = SimulatedBackend.open("2xH100-80GB", tmp_path / "node")
    yield backend
    backend.close()


@pytest.fixture
def api() -> InMemoryKube:
    kube = InMemoryKube()
    kube.add_node("gpu-1")
    kube.add_node("cpu-1")
    return kube


@pytest.fixture
def plugin(
    api: InMemoryKube, node: SimulatedBackend, sockets: Path, kubelet: TestKubelet, tmp_path: Path
) -> Iterator[DevicePlugin]:
    lib_dir = hostfiles.install(tmp_path / "lib")
    files = ShareFiles(tmp_path / "state", lib_dir, container_root=tmp_path / "container")
    with serving(DevicePlugin(api, "gpu-1", node, sockets, files, KEY), kubelet) as plugin:
        yield plugin


@pytest.fixture(scope="module")
def shim_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim_client(tmp_path_factory.mktemp("prog") / "shim_client")


def _run_container(response: Any, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Start a process as the runtime would start the container: the envs, and the mounts in
    place (links from the container's paths to the host's files)."""
    for mount in response.mounts:
        target = Path(mount.container_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_symlink():  # a second process of the same container
            target.symlink_to(mount.host_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env.update(response.envs)
    # what /etc/ld.so.preload and /etc/gpupool/shim.conf do for every process of a container
    mounts = {Path(m.container_path).name: m for m in response.mounts}
    preload = Path(mounts[Path(CONTAINER_PRELOAD).name].host_path).read_text()
    assert preload == f"{CONTAINER_LIBRARY}\n"
    env["LD_PRELOAD"] = mounts[Path(CONTAINER_LIBRARY).name].container_path
    env["GPUPOOL_CONFIG_FILE"] = mounts[Path(CONTAINER_CONFIG).name].container_path
    # the workload tries to raise its own limit: the read-only settings file wins
    env["GPUPOOL_MEMORY_LIMIT_0"] = "70Gi"
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_a_pod_is_filtered_scored_bound_allocated_and_its_share_holds(
    api: InMemoryKube,
    plugin: DevicePlugin,
    kubelet: TestKubelet,
    shim_client: Path,
) -> None:
    inventory = decode(api.nodes["gpu-1"]["metadata"]["annotations"][names.ANN_NODE_GPUS])
    assert [(g.index, g.model, g.memory) for g in inventory] == [
        (0, "H100-80GB", 81559 * MiB),
        (1, "H100-80GB", 81559 * MiB),
    ]
    assert len(kubelet.latest_devices()) == 2 * names.SLOTS_PER_GPU
    # a pod already on GPU 1: the 10Gi pod goes next to it under the gpupool policy
    api.add_pod(gpu_pod("other", memory="20Gi", compute="50"))
    pod = api.add_pod(gpu_pod("train", memory="10Gi", compute="30"))
    extender = Extender(api, key=KEY)
    with ExtenderServer(extender) as http:
        assert bind(http, "other") == {}
        # the kubelet admits it before gpupool binds another 1-GPU pod to the node
        other = kubelet.admit(1)
        assert other.envs["GPUPOOL_MEMORY_LIMIT_0"] == str(20 * GiB)
        args = {"pod": pod, "nodenames": ["gpu-1", "cpu-1"]}
        filtered = http.post("/filter", json=args).json()
        assert filtered["nodenames"] == ["gpu-1"]
        assert "cpu-1" in filtered["failedAndUnresolvableNodes"]
        scores = http.post("/prioritize", json=args).json()
        assert [s["host"] for s in scores] == ["gpu-1", "cpu-1"]
        assert 0 < scores[0]["score"] <= 10 and scores[1]["score"] == 0
        assert bind(http, "train") == {}
    stored = api.pods[("default", "train")]
    assert stored["spec"]["nodeName"] == "gpu-1"
    ann = stored["metadata"]["annotations"]
    other_gpu = api.pods[("default", "other")]["metadata"]["annotations"][names.ANN_GPUS]
    assert ann[names.ANN_GPUS] == other_gpu
    assert ann[names.ANN_MEMORY_BYTES] == str(10 * GiB)
    assert ann[names.ANN_COMPUTE_MILLI] == "300"

    response = kubelet.admit(1)
    # the slot the kubelet was steered to is the one the extender chose, on the pod's GPU
    assert kubelet.last_devices == ann[names.ANN_SLOTS].split(",")
    gpu = next(g for g in plugin.gpus if g.index == int(ann[names.ANN_GPUS]))
    assert kubelet.last_devices[0].startswith(f"{gpu.uuid}::")
    assert names.ANN_ALLOCATED in api.pods[("default", "train")]["metadata"]["annotations"]
    assert response.envs["CUDA_VISIBLE_DEVICES"] == ann[names.ANN_GPUS]
    assert response.envs["GPUPOOL_MEMORY_LIMIT_0"] == str(10 * GiB)
    assert response.envs["GPUPOOL_COMPUTE_LIMIT"] == "30"
    assert {m.container_path.rsplit("/", 1)[-1]: m.read_only for m in response.mounts} == {
        "libgpupool-cuda.so": True,
        "ld.so.preload": True,
        "shim.conf": True,
        "share": False,
        "arbiter": True,
        # --simulate: the simulated driver and node, from the host as well
        "sim": True,
        "sim-node": False,
    }
    # the node's compute arbiter, read-only, named in the read-only settings with the share's
    # name there; the pod asked for no priority, so it is a high share
    arbiter = next(m for m in response.mounts if m.container_path.endswith("/arbiter"))
    assert Path(arbiter.host_path) == plugin.arbiter.directory
    # root's alone to write: containers connect to its lease socket and read its views
    found = os.stat(arbiter.host_path)
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (os.geteuid(), 0o755)
    assert response.envs["GPUPOOL_ARBITER_DIR"] == arbiter.container_path
    assert "GPUPOOL_ARBITER_SHARE" in response.envs
    assert response.envs["GPUPOOL_COMPUTE_PRIORITY"] == "high"

    result = _run_container(
        response, [str(shim_client), "meminfo", "alloc", str(11 * GiB), "alloc", str(4 * GiB)]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"meminfo {10 * GiB} {10 * GiB}",
        f"alloc {CUDA_OUT_OF_MEMORY}",
        "alloc 0",
    ]
    # its kernels take turns through the node's arbiter, which charged it for its leases
    busy = _run_container(response, [str(shim_client), "run", "0.3", "kernel"])
    assert busy.returncode == 0, busy.stderr
    assert "compute arbiter" not in busy.stderr, busy.stderr
    share_id = int(response.envs["GPUPOOL_ARBITER_SHARE"].split(":")[0], 16)
    gpu = next(g for g in inventory if str(g.index) == ann[names.ANN_GPUS])
    charged = find_share(Path(arbiter.host_path), gpu.uuid, share_id)
    assert charged is not None and charged.percent == 30 and charged.busy_ns > 0, charged


def test_allocate_for_a_pod_the_extender_never_saw_is_refused(
    plugin: DevicePlugin, kubelet: TestKubelet, api: InMemoryKube
) -> None:
    api.add_pod({**gpu_pod("stray"), "spec": {**gpu_pod("stray")["spec"], "nodeName": "gpu-1"}})
    assert kubelet.plugin is not None
    slot = kubelet.latest_devices()[0][0]
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devicesIDs=[slot])]
    )
    with pytest.raises(grpc.RpcError) as caught:
        kubelet.plugin.Allocate(request)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert str(caught.value.details()) == (
        "pod default/stray carries no gpupool allocation: was it scheduled by gpupool-scheduler?"
    )


def test_a_lost_gpu_becomes_unhealthy(
    plugin: DevicePlugin, kubelet: TestKubelet, node: SimulatedBackend, api: InMemoryKube
) -> None:
    node.node.state.set_flags(1, FLAG_LOST)

    def unhealthy() -> set[str]:
        return {d.split("::")[0] for d, h in kubelet.latest_devices() if h == "Unhealthy"}

    lost = wait_for(unhealthy, what="an Unhealthy update")
    assert lost == {plugin.gpus[1].uuid}
    published = api.nodes["gpu-1"]["metadata"]["annotations"][names.ANN_NODE_GPUS]
    assert [g.healthy for g in decode(published)] == [True, False]


def test_a_restarted_kubelet_gets_the_plugin_registered_again(
    plugin: DevicePlugin, kubelet: TestKubelet, sockets: Path
) -> None:
    assert len(kubelet.registrations) == 1
    kubelet.stop()
    restarted = TestKubelet(sockets).start()
    try:
        wait_for(lambda: restarted.registrations and restarted.device_lists, what="re-register")
        assert restarted.registrations[0].resource_name == names.RESOURCE_GPU
        assert len(restarted.latest_devices()) == 2 * names.SLOTS_PER_GPU
    finally:
        restarted.stop()


def test_an_api_server_timing_out_during_allocate_is_an_error_then_a_retry_works(
    plugin: DevicePlugin, kubelet: TestKubelet, api: InMemoryKube
) -> None:
    api.add_pod(gpu_pod("late", memory="4Gi"))
    with ExtenderServer(Extender(api, key=KEY)) as http:
        assert bind(http, "late") == {}
    # the list answers, the patch that marks the pod served times out
    original = api.patch_pod_annotations

    def timing_out(*args: Any) -> None:
        api.fail_next = 1
        original(*args)

    api.patch_pod_annotations = timing_out  # type: ignore[method-assign]
    with pytest.raises(grpc.RpcError) as caught:
        kubelet.admit(1)
    api.patch_pod_annotations = original  # type: ignore[method-assign]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "timed out" in str(caught.value.details())
    assert names.ANN_ALLOCATED not in api.pods[("default", "late")]["metadata"]["annotations"]
    response = kubelet.admit(1)
    assert response.envs["GPUPOOL_MEMORY_LIMIT_0"] == str(4 * GiB)


def test_the_files_of_a_finished_pod_are_removed(
    plugin: DevicePlugin, kubelet: TestKubelet, api: InMemoryKube
) -> None:
    for name in ("keep", "done"):
        api.add_pod(gpu_pod(name, memory="1Gi"))
    with ExtenderServer(Extender(api, key=KEY)) as http:
        for name in ("keep", "done"):
            assert bind(http, name) == {}
            kubelet.admit(1)
    assert plugin.files.keys() == {"uid-default-keep", "uid-default-done"}
    api.pods[("default", "done")]["status"] = {"phase": "Succeeded"}
    plugin.collect_garbage()
    assert plugin.files.keys() == {"uid-default-keep"}


def test_an_earlier_versions_library_is_removed_once_no_container_uses_it(
    plugin: DevicePlugin, kubelet: TestKubelet, api: InMemoryKube, tmp_path: Path
) -> None:
    old = plugin.files.lib_dir
    api.add_pod(gpu_pod("before", memory="1Gi"))
    with ExtenderServer(Extender(api, key=KEY)) as http:
        assert bind(http, "before") == {}
    kubelet.admit(1)  # allocated, its container not started (nothing mounts the files yet)
    # the plugin is upgraded: another library installs beside the old one
    native = tmp_path / "native"
    shutil.copytree(NATIVE_DIR, native, symlinks=True)
    (native / SHIM_LIBRARY).write_bytes((native / SHIM_LIBRARY).read_bytes() + b"\0")
    plugin.files = ShareFiles(
        plugin.files.state_dir,
        hostfiles.install(old.parent, native),
        container_root=plugin.files.container_root,
    )
    # a third version some container on the host has mounted, which the plugin never recorded
    mounted = old.parent / "0.0.1-0123456789ab"
    shutil.copytree(old, mounted)
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'mount --bind "{mounted / SHIM_LIBRARY}" "{tmp_path / "target"}" && echo up && '
         "exec sleep 60"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    (tmp_path / "target").touch()
    foreign = old.parent / "not-ours"
    foreign.mkdir()
    # staging directories: one of an install that died an hour ago, one being written now
    for name, age in ((".install-dead", hostfiles.STAGING_STALE_S + 60), (".install-now", 0)):
        (old.parent / name).mkdir()
        os.utime(old.parent / name, (time.time() - age,) * 2)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "up\n"
        plugin.collect_garbage()
        assert old.is_dir() and mounted.is_dir()  # a pod allocated it; a container mounts it
        api.pods[("default", "before")]["status"] = {"phase": "Succeeded"}
        plugin.collect_garbage()
        assert not old.exists() and mounted.is_dir()
    finally:
        holder.kill()
        holder.wait()
    plugin.collect_garbage()
    assert sorted(p.name for p in old.parent.iterdir()) == sorted(
        [plugin.files.lib_dir.name, "not-ours", ".install-now"]
    )


def test_a_low_priority_pod_is_a_low_share_on_the_shared_arbiters(
    api: InMemoryKube, plugin: DevicePlugin, kubelet: TestKubelet
) -> None:
    # a high pod holds all of both GPUs' compute: the low pod is bound beside it all the same
    api.add_pod(gpu_pod("busy", gpus="2", memory="20Gi", compute="100"))
    api.add_pod(
        gpu_pod("batch", memory="10Gi", compute="30", annotations={names.ANN_PRIORITY: "low"})
    )
    with ExtenderServer(Extender(api, key=KEY)) as http:
        for name in ("busy", "batch"):
            assert bind(http, name) == {}
    response = kubelet.admit(1)
    assert response.envs["GPUPOOL_COMPUTE_PRIORITY"] == "low"
    # it holds no compute in placement, and its share still asks the arbiter for what it asked
    assert response.envs["GPUPOOL_COMPUTE_LIMIT"] == "30"
    arbiter = next(m for m in response.mounts if m.container_path.endswith("/arbiter"))
    assert Path(arbiter.host_path) == plugin.arbiter.directory


def _rate(stdout: str) -> float:
    _run, launches, elapsed = stdout.split()
    return int(launches) * 1e9 / int(elapsed)


def test_a_host_share_and_a_pods_share_on_one_gpu_are_arbitrated_together(
    api: InMemoryKube,
    plugin: DevicePlugin,
    kubelet: TestKubelet,
    node: SimulatedBackend,
    shim_client: Path,
) -> None:
    """One arbiter per GPU per node: `gpupool exec` (root's, so the node's arbiter) with 70 %
    next to a pod with 30 % on the same simulated GPU; each gets its share, and the arbiter
    knows both processes."""
    api.add_pod(gpu_pod("train", memory="10Gi", compute="30"))
    with ExtenderServer(Extender(api, key=KEY)) as http:
        assert bind(http, "train") == {}
    response = kubelet.admit(1)
    gpu = api.pods[("default", "train")]["metadata"]["annotations"][names.ANN_GPUS]
    alone = _run_container(response, [str(shim_client), "run", "1", "kernel"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    exec_argv = ["gpupool", "exec", "--node-dir", str(node.node_dir), "--gpu", gpu]
    host_cmd = [sys.executable, "-m", *exec_argv, "--compute", "70", "--"]
    base_cmd = [*host_cmd[:-3], "--"]
    base = subprocess.run(
        [*base_cmd, str(shim_client), "run", "1", "kernel"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert alone.returncode == 0 and base.returncode == 0, (alone.stderr, base.stderr)
    host = subprocess.Popen(
        [*host_cmd, str(shim_client), "run", "4", "kernel"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pod: dict[str, subprocess.CompletedProcess[str]] = {}
    runner = threading.Thread(
        target=lambda: pod.update(
            done=_run_container(response, [str(shim_client), "run", "4", "kernel"])
        )
    )
    runner.start()
    uuid = next(g.uuid for g in plugin.gpus if str(g.index) == gpu)
    view = view_file(plugin.arbiter.directory, uuid)
    seen = wait_for(lambda: len(lease_clients(view)) == 2 and lease_clients(view), what="both")
    runner.join()
    out, err = host.communicate(timeout=60)
    assert host.returncode == 0 and pod["done"].returncode == 0, (err, pod["done"].stderr)
    assert len({c.share_id for c in seen}) == 2  # two shares of one arbiter, one GPU
    # each named by its pid in the node's PID namespace, as the host daemon's watchdog reads
    # the driver's (0: a process the arbiter cannot see)
    assert all(c.pid > 0 for c in seen), seen
    full = _rate(base.stdout)
    assert abs(_rate(out) / full - 0.70) <= 0.05, (out, base.stdout)
    assert abs(_rate(pod["done"].stdout) / full - 0.30) <= 0.05, (pod["done"].stdout, base.stdout)
