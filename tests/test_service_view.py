"""`gpupool service ls`, `top` and the dashboard's Services panel: the mode where it is not
shim, and a service's swaps."""

from __future__ import annotations

from typing import Any

from gpupool.api.dashboard_services import services_html
from gpupool.cli.service_view import HEADER, rows
from gpupool.cli.top_view import _service_line


def service(name: str, mode: str) -> dict[str, Any]:
    return {
        "name": name,
        "user": "alice",
        "replicas": {"ready": 1, "desired": 1, "min": 1, "max": 2},
        "in_flight": 0,
        "queued": 0,
        "requests_total": 3,
        "errors_total": 0,
        "memory": "8Gi",
        "compute": 25,
        "priority": "high",
        "mode": mode,
        "gpus": [0],
        "problem": "",
    }


def test_the_share_column_names_mps_and_leaves_the_default_mode_out() -> None:
    column = HEADER.index("SHARE")
    shim, mps = rows([service("chat", "shim"), service("embed", "mps")])
    assert shim[column] == "8Gi/25%/high"
    assert mps[column] == "8Gi/25%/high/mps"


def test_the_dashboards_services_panel_names_mps_too() -> None:
    shown = services_html({"services": [service("chat", "shim"), service("embed", "mps")]})
    chat, embed = shown.split('data-service="chat"')[1].split('data-service="embed"')
    assert "8Gi 25% high</td>" in chat
    assert "8Gi 25% high mps</td>" in embed


def test_swaps_and_parking_show_in_the_listing_the_top_line_and_the_dashboard() -> None:
    swapped = {
        **service("chat", "shim"),
        "resident": False,
        "swaps": {"out": 2, "in": 1, "in_seconds_sum": 0.41, "last_in_s": 0.41},
    }
    (line,) = rows([swapped])
    assert line[HEADER.index("SWAPS")] == "2 out, 1 in, last 0.41s"
    assert rows([service("embed", "shim")])[0][HEADER.index("SWAPS")] == "-"  # an older daemon
    assert "swaps 2 out, 1 in, last 0.41s" in _service_line(swapped).plain
    assert "<td>2 / 1 (0.41 s) parked</td>" in services_html({"services": [swapped]})
