"""The swap on a real GPU: two GPT-2 services (examples/torch_server.py, random weights) whose
shares do not fit the GPU together, so one is parked in host memory while the other serves; the
first-token time of a request for the parked one (a swap in) against a cold start (the server's
start and its model's load) and against a resident model. Run by inference_pool.py `--swap`.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inference_support import Pool

#: each share more than half the GPU: the two never fit together
SHARE = {"memory": "60%", "compute": 50, "mode": "shim", "min_replicas": 0, "max_replicas": 1}
SHARE |= {"ready_timeout_s": 600.0, "window_s": 1.0}
#: a swap out takes an idle service: no request for 0.5 s (agent/service_swap.py)
PARKED_WITHIN_S = 120.0

FirstToken = Callable[[Pool, str], float]


def parked(pool: Pool, name: str, timeout: float = PARKED_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replicas = pool.service(name)["replica_list"]
        if replicas and replicas[0]["state"] == "suspended":
            return
        time.sleep(0.1)
    raise SystemExit(f"{name} was not parked within {timeout:g}s: {pool.service(name)}")


def measure_swap(spec: str | None, argv: list[str], first_token: FirstToken) -> dict[str, Any]:
    """Cold start, resident and swapped-in first tokens of one model of two that do not fit."""
    with (
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
        Pool(Path(tmp), spec) as pool,
    ):
        began = time.perf_counter()
        pool.create("swap-a", argv=argv, **SHARE)
        pool.wait_ready("swap-a", timeout=600)
        cold = time.perf_counter() - began + first_token(pool, "swap-a")
        resident = first_token(pool, "swap-a")
        pool.create("swap-b", argv=argv, **SHARE)  # swap-a, idle, is parked for it
        pool.wait_ready("swap-b", timeout=600)
        parked(pool, "swap-a")
        swapped = first_token(pool, "swap-a")  # swap-b is parked for it in turn
        service = pool.service("swap-a")
    return {
        "cold_start_s": round(cold, 3),
        "resident_s": round(resident, 3),
        "swapped_s": round(swapped, 3),
        "swap_in_s": service["swaps"]["last_in_s"],
        "swaps": service["swaps"],
    }


def report(result: dict[str, Any]) -> list[str]:
    return [
        "## Swap: two GPT-2 services of 60 % of the GPU each",
        "",
        "| first token | seconds |",
        "|---|---|",
        f"| cold start (create to first token) | {result['cold_start_s']} |",
        f"| resident | {result['resident_s']} |",
        f"| parked, swapped in for the request | {result['swapped_s']} |",
        f"| of it, the swap in (wake to ready) | {result['swap_in_s']} |",
        "",
    ]
