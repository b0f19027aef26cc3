"""The one seam to the Kubernetes API server, and its in-memory implementation.

Objects are the API server's JSON (dicts). Every failure of the server (refused, timed out,
conflict, not found) is `KubeApiError`, whichever implementation raised it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpupool.core.errors import KubeApiError

Obj = dict[str, Any]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about a pod (or a node): Normal or Warning, a reason and a message."""

    namespace: str
    involved_kind: str
    involved_name: str
    type: str
    reason: str
    message: str


class KubeApi(Protocol):
    """What gpupool needs of the API server."""

    def get_pod(self, namespace: str, name: str) -> Obj: ...

    def list_pods_on_node(self, node: str) -> list[Obj]:
        """Pods bound to `node` (spec.nodeName) that have not finished."""
        ...

    def patch_pod_annotations(
        self, namespace: str, name: str, uid: str, values: Mapping[str, str | None]
    ) -> None:
        """Set annotations (None removes one) if the pod's UID is still `uid` (a precondition:
        a pod re-created under the same name is not patched)."""
        ...

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    def get_node(self, name: str) -> Obj: ...

    def list_nodes(self) -> list[Obj]: ...

    def patch_node_annotations(self, name: str, values: dict[str, str]) -> None: ...

    def create_event(self, event: Event) -> None: ...


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.setdefault("metadata", {})
    return meta


@dataclass
class InMemoryKube:
    """An API server in memory: pods, nodes and events, with the same errors as the real one.

    `fail_next` makes the next N calls fail as a timed-out server would, to test recovery.
    `run_on_bind` stands in for kubelets that admit and start every pod as soon as it is bound
    (for tests and benchmarks of the extender alone, with no device plugin).
    """

    pods: dict[tuple[str, str], Obj] = field(default_factory=dict)
    nodes: dict[str, Obj] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    fail_next: int = 0
    run_on_bind: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _call(self) -> None:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise KubeApiError("the Kubernetes API server timed out (in-memory fault)")

    def add_pod(self, pod: Obj) -> Obj:
        meta = _meta(pod)
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", f"uid-{meta['namespace']}-{meta['name']}")
        meta.setdefault("annotations", {})
        with self._lock:
            self.pods[(meta["namespace"], meta["name"])] = pod
        return pod

    def add_node(self, name: str, annotations: dict[str, str] | None = None) -> Obj:
        node: Obj = {"metadata": {"name": name, "annotations": dict(annotations or {})}}
        with self._lock:
            self.nodes[name] = node
        return node

    def _pod(self, namespace: str, name: str) -> Obj:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise KubeApiError(f"pod {namespace}/{name} not found")
        return pod

    def get_pod(self, namespace: str, name: str) -> Obj:
        with self._lock:
            self._call()
            return copy.deepcopy(self._pod(namespace, name))

    def list_pods_on_node(self, node: str) -> list[Obj]:
        with self._lock:
            self._call()
            return [
                copy.deepcopy(p)
                for p in self.pods.values()
                if (p.get("spec") or {}).get("nodeName") == node
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]

    def patch_pod_annotations(
        self, namespace: str, name: str, uid: str, values: Mapping[str, str | None]
    ) -> None:
        with self._lock:
            self._call()
            meta = _meta(self._pod(namespace, name))
            if meta.get("uid") != uid:
                raise KubeApiError(
                    f"annotate pod {namespace}/{name}: the API server answered 409 "
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                    f"{meta.get('uid')}"
                )
            annotations = meta.setdefault("annotations", {})
            for key, value in values.items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        with self._lock:
            self._call()
            pod = self._pod(namespace, name)
            if _meta(pod).get("uid") != uid:
                raise KubeApiError(f"binding pod {namespace}/{name}: uid {uid} does not match")
            spec = pod.setdefault("spec", {})
            if spec.get("nodeName"):
                raise KubeApiError(f"pod {namespace}/{name} is already bound to {spec['nodeName']}")
            spec["nodeName"] = node
            if self.run_on_bind:
                pod["status"] = {"phase": "Running"}

    def get_node(self, name: str) -> Obj:
        with self._lock:
            self._call()
            node = self.nodes.get(name)
            if node is None:
                raise KubeApiError(f"node {name} not found")
            return copy.deepcopy(node)

    def list_nodes(self) -> list[Obj]:
        with self._lock:
            self._call()
            return [copy.deepcopy(n) for n in self.nodes.values()]

    def patch_node_annotations(self, name: str, values: dict[str, str]) -> None:
        with self._lock:
            self._call()
            node = self.nodes.get(name)
            if node is None:
                raise KubeApiError(f"node {name} not found")
            _meta(node).setdefault("annotations", {}).update(values)

    def create_event(self, event: Event) -> None:
        with self._lock:
            self._call()
            self.events.append(event)
