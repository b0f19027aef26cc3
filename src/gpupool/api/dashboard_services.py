"""The web dashboard's Services panel: each service's replicas, traffic, swaps and problem."""

from __future__ import annotations

from html import escape
from typing import Any

from gpupool.agent.view import NodeView


def services_data(view: NodeView) -> list[dict[str, Any]]:
    """Each service's line of `service ls` (anyone on the node may see it)."""
    return [service.summary() for service in view.services.services()] if view.services else []


def _mode(service: dict[str, Any]) -> str:
    """The sharing mode where it is not the default, as `service ls` shows it."""
    return "" if service["mode"] == "shim" else f" {escape(service['mode'])}"


def _swaps(service: dict[str, Any]) -> str:
    """`2 / 1 (0.41 s)`: parked for other services, back for its own requests, the last swap
    in's time; whether it is resident now (`parked` when its replica is in host memory)."""
    counts = service.get("swaps") or {}
    last = counts.get("last_in_s")
    text = f"{counts.get('out', 0)} / {counts.get('in', 0)}"
    text += f" ({last:.2f} s)" if last is not None else ""
    return text + ("" if service.get("resident", True) else " parked")


def services_html(data: dict[str, Any]) -> str:
    services = data.get("services") or []
    if not services:
        return '<p class="empty">no services</p>'
    rows = []
    for service in services:
        replicas = service["replicas"]
        gpus = ",".join(str(g) for g in service["gpus"]) or "&ndash;"
        state = "bad" if service["problem"] else ("running" if replicas["ready"] else "queued")
        rows.append(
            f'<tr data-service="{escape(service["name"])}">'
            f"<td>{escape(service['name'])}</td><td>{escape(service['user'])}</td>"
            f'<td><span class="badge {state}">{replicas["ready"]} / {replicas["desired"]}'
            f"</span></td><td>{replicas['min']}..{replicas['max']}</td>"
            f"<td>{service['in_flight']}</td><td>{service['queued']}</td>"
            f"<td>{service['requests_total']}</td><td>{service['errors_total']}</td>"
            f"<td>{escape(service['memory'] or '')} {service['compute']}% "
            f"{escape(service['priority'])}{_mode(service)}</td><td>{gpus}</td>"
            f"<td>{_swaps(service)}</td><td>{escape(service['problem'] or '')}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "service",
            "user",
            "ready / desired",
            "replicas",
            "in flight",
            "waiting",
            "requests",
            "5xx",
            "share per replica",
            "GPUs",
            "swaps out / in (last in)",
            "problem",
        )
    )
    return (
        f'<table class="jobs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
