"""The plain manifests and the Helm chart are valid Kubernetes objects (checked offline)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpupool.k8s import names
from gpupool.k8s.extender import Extender
from gpupool.k8s.extender_http import create_app
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


def test_the_helm_chart_renders_valid_objects() -> None:
    helm = shutil.which("helm")
    if helm is None:
        pytest.skip("helm is not installed: the chart is not rendered here")
    rendered = subprocess.run(
        [helm, "template", "gpupool", str(CHART), "--namespace", "gpupool"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    docs = documents(rendered)
    validate_all(docs)
    check_scheduler_config(docs)
