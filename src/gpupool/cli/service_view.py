"""How `gpupool service ls|describe` and `gpupool ps` print services (the client only formats)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpupool.cli import texttable
from gpupool.cli.lines import say

HEADER = ["NAME", "USER", "READY", "DESIRED", "MIN..MAX", "IN-FLIGHT", "QUEUED", "REQUESTS"]
HEADER += ["5XX", "SHARE", "GPUS", "MODELS", "SWAPS", "PROBLEM"]


def _share(service: dict[str, Any]) -> str:
    memory = service["memory"] or "-"
    return f"{memory}/{service['compute']}%/{service['priority']}"


def _share_and_mode(service: dict[str, Any]) -> str:
    """The share, and the mode when it is not the default (`8Gi/25%/high/mps`)."""
    mode = service["mode"]
    return _share(service) + ("" if mode == "shim" else f"/{mode}")


def _ready(replicas: dict[str, Any]) -> str:
    """`0`, or `0 (1 suspended)` while a replica is parked in host memory."""
    suspended = replicas.get("suspended", 0)
    return f"{replicas['ready']} ({suspended} suspended)" if suspended else str(replicas["ready"])


def _models(service: dict[str, Any]) -> str:
    """The model names it answers for at the router's OpenAI API (a daemon from before them
    sends none: its name)."""
    return ",".join(service.get("models") or [service["name"]])


def swaps(service: dict[str, Any]) -> str:
    """`-`, or `2 out, 1 in, last 0.41s`: parked for other services, back for its own requests,
    and how long the last swap in took (a daemon from before swaps sends none: `-`)."""
    counts = service.get("swaps") or {}
    out, back = counts.get("out", 0), counts.get("in", 0)
    if not out and not back:
        return "-"
    last = counts.get("last_in_s")
    return f"{out} out, {back} in" + (f", last {last:.2f}s" if last is not None else "")


def rows(services: list[dict[str, Any]]) -> list[list[str]]:
    table = []
    for service in services:
        replicas = service["replicas"]
        table.append(
            [
                service["name"],
                service["user"],
                _ready(replicas),
                str(replicas["desired"]),
                f"{replicas['min']}..{replicas['max']}",
                str(service["in_flight"]),
                str(service["queued"]),
                str(service["requests_total"]),
                str(service["errors_total"]),
                _share_and_mode(service),
                ",".join(str(g) for g in service["gpus"]) or "-",
                _models(service)[:60],
                swaps(service),
                (service["problem"] or "")[:60],
            ]
        )
    return table


def print_services(services: list[dict[str, Any]]) -> None:
    if not services:
        say("no services (gpupool service create NAME --replicas MIN..MAX -- CMD)")
        return
    for line in texttable.lines(HEADER, rows(services), right={2, 3, 5, 6, 7, 8}):
        say(line)


def print_service(service: dict[str, Any]) -> None:
    spec = service["spec"]
    replicas = service["replicas"]
    suspended = replicas.get("suspended", 0)
    say(f"service {service['name']} (generation {service['generation']}), by {service['user']}")
    command = " ".join(spec["argv"]) if spec["argv"] is not None else "(hidden: not yours)"
    say(f"  command:     {command}")
    say(
        f"  replicas:    {replicas['ready']} ready of {replicas['desired']} desired, "
        f"{replicas['min']}..{replicas['max']}"
        + (f" ({service['why']})" if service["why"] else "")
        + (f"; {suspended} suspended in host memory" if suspended else "")
    )
    keep = spec.get("keep_alive_s")
    resident = "for good" if keep == -1 else (f"{keep:g}s" if keep is not None else "--idle")
    say(f"  swaps:       {swaps(service)} (keep alive {resident})")
    say(
        f"  share:       {_share(service)} per replica, mode {service['mode']}, concurrency "
        f"{service['concurrency']}, idle {spec['idle_s']:g}s, window {spec['window_s']:g}s"
    )
    say(f"  models:      {_models(service)} (POST /v1/... at the router, by the body's model)")
    say(f"  health:      GET {spec['health']} (ready within {spec['ready_timeout_s']:g}s)")
    statuses = ", ".join(f"{code}: {n}" for code, n in service["statuses"].items()) or "none"
    say(
        f"  traffic:     {service['in_flight']} in flight, {service['queued']} waiting; "
        f"answers {statuses}"
    )
    say(f"  restarts:    {service['restarts']}")
    if service["problem"]:
        say(f"  problem:     {service['problem']}")
    if service["replica_list"]:
        header = ["REPLICA", "JOB", "STATE", "GPUS", "PORT", "GEN", "IN-FLIGHT", "NOTE"]
        table = [
            [
                str(r["index"]),
                str(r["job_id"]),
                r["state"],
                ",".join(str(g) for g in r["gpus"]) or "-",
                str(r["port"]),
                str(r["generation"]),
                str(r["in_flight"]),
                (r["note"] or "")[:70],
            ]
            for r in service["replica_list"]
        ]
        for line in texttable.lines(header, table, right={0, 1, 4, 5, 6}):
            say("  " + line)
    say("  events:")
    for event in service["events"][-15:]:
        at = datetime.fromtimestamp(event["at"]).strftime("%H:%M:%S")
        say(f"    {at}  {event['detail']}")
