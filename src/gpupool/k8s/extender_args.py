"""The extender's request bodies checked before use: any ill-typed field is InvalidRequest.

kube-scheduler sends ExtenderArgs ({"Pod", "Nodes", "NodeNames"}) and ExtenderBindingArgs
({"PodName", "PodNamespace", "PodUID", "Node"}), field names matched without regard to case as
Go's encoding/json does. The extender reads only the fields checked here, so a well-formed JSON
body of the wrong shape is answered 400 with the field at fault, never a traceback.
"""

from __future__ import annotations

from typing import Any

from gpupool.core.errors import InvalidRequest


def _field(args: dict[str, Any], name: str) -> Any:
    """`args[name]`, the key matched without regard to case (Go's encoding/json)."""
    if name in args:
        return args[name]
    lowered = name.lower()
    return next((v for k, v in args.items() if k.lower() == lowered), None)


def _kind(value: Any, kind: type | tuple[type, ...], where: str, what: str) -> Any:
    if value is None:
        raise InvalidRequest(f"{where} is missing")
    # bool is an int in Python, never in the API's JSON
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidRequest(f"{where} must be {what}, not {type(value).__name__}")
    return value


def _strings(value: Any, where: str) -> None:
    _kind(value, dict, where, "an object")
    for key, item in value.items():
        _kind(item, str, f"{where}[{key!r}]", "a string")


def _quantities(value: Any, where: str) -> None:
    _kind(value, dict, where, "an object")
    for key, item in value.items():
        _kind(item, (str, int, float), f"{where}[{key!r}]", "a quantity")


def _metadata(obj: dict[str, Any], where: str) -> None:
    meta = obj.get("metadata")
    if meta is None:
        return
    _kind(meta, dict, f"{where}.metadata", "an object")
    for key in ("name", "namespace", "uid"):
        if meta.get(key) is not None:
            _kind(meta[key], str, f"{where}.metadata.{key}", "a string")
    if meta.get("annotations") is not None:
        _strings(meta["annotations"], f"{where}.metadata.annotations")


def check_pod(pod: Any) -> None:
    """The parts of a Pod the extender and the webhook read."""
    _kind(pod, dict, "Pod", "an object")
    _metadata(pod, "Pod")
    spec = pod.get("spec")
    if spec is None:
        return
    _kind(spec, dict, "Pod.spec", "an object")
    if spec.get("nodeName") is not None:
        _kind(spec["nodeName"], str, "Pod.spec.nodeName", "a string")
    containers = spec.get("containers")
    if containers is None:
        return
    _kind(containers, list, "Pod.spec.containers", "a list")
    for i, container in enumerate(containers):
        where = f"Pod.spec.containers[{i}]"
        _kind(container, dict, where, "an object")
        resources = container.get("resources")
        if resources is None:
            continue
        _kind(resources, dict, f"{where}.resources", "an object")
        for part in ("limits", "requests"):
            if resources.get(part) is not None:
                _quantities(resources[part], f"{where}.resources.{part}")


def check_extender_args(args: dict[str, Any]) -> None:
    """ExtenderArgs for /filter and /prioritize."""
    pod = _field(args, "Pod")
    if pod is None:
        raise InvalidRequest("ExtenderArgs without a Pod")
    check_pod(pod)
    nodes = _field(args, "Nodes")
    if nodes is not None:
        _kind(nodes, dict, "Nodes", "a NodeList object")
        items = nodes.get("items")
        if items is not None:
            _kind(items, list, "Nodes.items", "a list")
            for i, node in enumerate(items):
                _kind(node, dict, f"Nodes.items[{i}]", "an object")
                meta = _kind(node.get("metadata"), dict, f"Nodes.items[{i}].metadata", "an object")
                _kind(meta.get("name"), str, f"Nodes.items[{i}].metadata.name", "a string")
    names = _field(args, "NodeNames")
    if names is not None:
        _kind(names, list, "NodeNames", "a list of node names")
        # 10,000 names: one pass in C (0.2 ms), the slow loop only to name the bad one
        if not set(map(type, names)) <= {str}:
            for i, name in enumerate(names):
                _kind(name, str, f"NodeNames[{i}]", "a string")


def check_binding_args(args: dict[str, Any]) -> None:
    """ExtenderBindingArgs for /bind: every field a string, all but the namespace non-empty."""
    for name in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = _field(args, name)
        if value is None and name == "PodNamespace":
            continue
        _kind(value, str, name, "a string")
        if not value and name != "PodNamespace":
            raise InvalidRequest(f"{name} must not be empty")
