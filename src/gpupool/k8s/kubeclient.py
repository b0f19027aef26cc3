"""The KubeApi seam over the official `kubernetes` client (in-cluster, else the kubeconfig).

Reads ask for the raw JSON (`_preload_content=False`), so the rest of gpupool sees the API
server's objects exactly as the in-memory implementation holds them. Every call has a timeout;
every failure becomes KubeApiError with the status and a truncated body.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpupool.core.errors import ConfigError, KubeApiError
from gpupool.k8s.kubeapi import Event, Obj

T = TypeVar("T")

#: seconds: (connect, read) for every call to the API server
TIMEOUT = (5.0, 15.0)
#: the client would pick JSON Patch (a list of operations) for a patch body; ours are objects
MERGE_PATCH = "application/merge-patch+json"


def _call(what: str, fn: Callable[[], T]) -> T:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn()
    except ApiException as err:
        body = str(err.body or "")[:200]
        raise KubeApiError(f"{what}: the API server answered {err.status} {body}") from err
    except (HTTPError, OSError) as err:
        raise KubeApiError(f"{what}: the API server did not answer: {err}") from err


def _json(response: Any) -> Obj:
    data: Obj = json.loads(response.data)
    return data


class OfficialKube:
    """KubeApi over `kubernetes.client.CoreV1Api`."""

    def __init__(self) -> None:
        try:
            from kubernetes import client, config
        except ImportError as err:
            raise ConfigError(
                "the Kubernetes commands need the k8s extra: pip install 'gpupool[k8s]'"
            ) from err
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            try:
                config.load_kube_config()  # type: ignore[no-untyped-call]
            except (config.ConfigException, OSError) as err:
                raise ConfigError(
                    f"no Kubernetes configuration: not in a cluster and no kubeconfig ({err})"
                ) from err
        self.client = client
        self.core = client.CoreV1Api()

    def get_pod(self, namespace: str, name: str) -> Obj:
        return _json(
            _call(
                f"get pod {namespace}/{name}",
                lambda: self.core.read_namespaced_pod(
                    name, namespace, _preload_content=False, _request_timeout=TIMEOUT
                ),
            )
        )

    def list_pods_on_node(self, node: str) -> list[Obj]:
        selector = f"spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed"
        data = _json(
            _call(
                f"list pods on {node}",
                lambda: self.core.list_pod_for_all_namespaces(
                    field_selector=selector, _preload_content=False, _request_timeout=TIMEOUT
                ),
            )
        )
        return list(data.get("items") or [])

    def patch_pod_annotations(
        self, namespace: str, name: str, uid: str, values: Mapping[str, str | None]
    ) -> None:
        # metadata.uid in a patch is a precondition: the API server answers 409 if it differs;
        # a null value removes the annotation (JSON merge semantics)
        body = {"metadata": {"uid": uid, "annotations": dict(values)}}
        _call(
            f"annotate pod {namespace}/{name}",
            lambda: self.core.patch_namespaced_pod(
                name,
                namespace,
                body,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=TIMEOUT,
            ),
        )

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        binding = self.client.V1Binding.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
        )
        assert binding is not None
        _call(
            f"bind pod {namespace}/{name} to {node}",
            lambda: self.core.create_namespaced_pod_binding(
                name, namespace, binding, _preload_content=False, _request_timeout=TIMEOUT
            ),
        )

    def get_node(self, name: str) -> Obj:
        return _json(
            _call(
                f"get node {name}",
                lambda: self.core.read_node(name, _preload_content=False, _request_timeout=TIMEOUT),
            )
        )

    def list_nodes(self) -> list[Obj]:
        data = _json(
            _call(
                "list nodes",
                lambda: self.core.list_node(_preload_content=False, _request_timeout=TIMEOUT),
            )
        )
        return list(data.get("items") or [])

    def patch_node_annotations(self, name: str, values: dict[str, str]) -> None:
        body = {"metadata": {"annotations": values}}
        _call(
            f"annotate node {name}",
            lambda: self.core.patch_node(
                name,
                body,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=TIMEOUT,
            ),
        )

    def create_event(self, event: Event) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = self.client.CoreV1Event.from_dict(
            {
                "metadata": {"generateName": "gpupool-", "namespace": event.namespace},
                "involvedObject": {
                    "kind": event.involved_kind,
                    "name": event.involved_name,
                    "namespace": event.namespace,
                },
                "type": event.type,
                "reason": event.reason,
                "message": event.message,
                "source": {"component": "gpupool"},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
        )
        assert body is not None
        _call(
            f"record event {event.reason}",
            lambda: self.core.create_namespaced_event(
                event.namespace, body, _preload_content=False, _request_timeout=TIMEOUT
            ),
        )
