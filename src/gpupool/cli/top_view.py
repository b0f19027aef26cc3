"""How `gpupool top` draws one frame from the daemon's `/v1/dashboard` (the client only formats).

A frame fits `width` x `height` (80x24 at least): a title line, one line per GPU (its memory and
compute bars split by the jobs on it, as the web dashboard draws them), then the jobs as many as
fit, and a last line with the keys.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpupool.cli import service_view
from gpupool.core.units import format_bytes

COLOURS = ("blue", "dark_orange", "green", "magenta", "yellow", "cyan", "red", "bright_black")
MEMORY_BAR, COMPUTE_BAR = 20, 14
#: service lines a frame shows at most (the jobs get the rest of the screen)
MAX_SERVICES = 6


def _colour(job_id: int) -> str:
    return COLOURS[job_id % len(COLOURS)]


def _short(value: int | None) -> str:
    """Bytes in at most 6 characters: 40GiB, 1.5GiB, 512MiB, as `format_bytes` without "iB"."""
    return "-" if value is None else format_bytes(value).removesuffix("iB").removesuffix("B")


def _bar(width: int, parts: list[tuple[str, float, float]], total: float) -> Text:
    """A bar of `width` cells: per part (style, share, used), the share's cells, its used part
    solid and the rest shaded; what no part takes is left blank."""
    bar = Text()
    taken = 0
    for style, share, used in parts:
        cells = max(1, round(share / total * width)) if total and share else 0
        cells = min(cells, width - taken)
        solid = min(cells, round(min(used, share) / share * cells)) if share else 0
        bar.append("█" * solid, style=style)
        bar.append("░" * (cells - solid), style=style)
        taken += cells
    bar.append("·" * (width - taken), style="bright_black")
    return bar


def _gpu_line(gpu: dict[str, Any]) -> Text:
    util = "  ?" if gpu["utilization"] is None else f"{gpu['utilization']:>3}"
    line = Text(f"{gpu['index']:>2} {gpu['model'][:10]:<10} {util}% ", style="bold")
    if not gpu["healthy"]:
        line.append("!", style="bold red")
    memory = [(_colour(j["id"]), j["memory_share"], j["memory_used"]) for j in gpu["jobs"]]
    line.append("mem ")
    line.append_text(_bar(MEMORY_BAR, memory, gpu["memory_total"]))
    line.append(f" {_short(gpu['memory_used']):>5}/{_short(gpu['memory_total']):<5}")
    compute = [(_colour(j["id"]), j["compute_share"], j["compute_used"] or 0) for j in gpu["jobs"]]
    line.append(" cmp ")
    line.append_text(_bar(COMPUTE_BAR, compute, 100))
    line.append(f" {sum(j['compute_share'] for j in gpu['jobs']):>3}%")
    return line


def _service_line(service: dict[str, Any]) -> Text:
    """A service: its replicas ready of desired, its traffic, its problem if any."""
    replicas = service["replicas"]
    line = Text(f"svc {service['name'][:14]:<14} ", style="bold")
    line.append(f"{replicas['ready']}/{replicas['desired']} ready ({replicas['min']}..")
    line.append(f"{replicas['max']})  {service['in_flight']:>3} in flight {service['queued']:>3} ")
    line.append(f"waiting {service['requests_total']:>7} req")
    if service["errors_total"]:
        line.append(f" {service['errors_total']} 5xx", style="red")
    if service.get("swaps", {}).get("out") or service.get("swaps", {}).get("in"):
        line.append(f"  swaps {service_view.swaps(service)}")
    if service["problem"]:
        line.append("  !", style="bold red")
    return line


def _jobs(jobs: list[dict[str, Any]], rows: int) -> Table:
    table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, expand=False)
    for name, justify in (
        ("ID", "right"),
        ("NAME", "left"),
        ("USER", "left"),
        ("STATE", "left"),
        ("GPUS", "left"),
        ("MEM USED/SHARE", "right"),
        ("CMP USED/SHARE", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    shown = jobs if len(jobs) <= rows else jobs[: max(0, rows - 1)]
    for job in shown:
        util = "-" if job["compute_used"] is None else f"{job['compute_used']}%"
        gpus = ",".join(str(g) for g in job["gpus"]) or f"({job['gpu_count']})"
        table.add_row(
            str(job["id"]),
            Text(job["name"][:16], style=_colour(job["id"])),
            job["user"][:10],
            job["state"],
            gpus[:8],
            f"{_short(job['memory_used'])}/{_short(job['memory_share'])}",
            f"{util}/{job['compute_share']}%",
        )
    if len(shown) < len(jobs):
        table.add_row("", f"... {len(jobs) - len(shown)} more", "", "", "", "", "")
    return table


def frame(data: dict[str, Any], height: int = 24, error: str | None = None) -> Group:
    """One screen of `top` from /v1/dashboard's answer; `error` (the daemon is not answering)
    is shown in place of the title's clock, over the last good data."""
    running = sum(1 for job in data["jobs"] if job["state"] == "running")
    queued = len(data["jobs"]) - running
    title = Text("gpupool top", style="bold")
    title.append(f"  {len(data['gpus'])} GPUs  {running} running  {queued} queued")
    if data["simulated"]:
        title.append("  simulated", style="yellow")
    if data["draining"]:
        title.append("  draining", style="bold red")
    if error:
        title.append(f"  {error}"[:40], style="bold red")
    else:
        title.append(f"  {time.strftime('%H:%M:%S', time.localtime(data['time']))}")
    gpus = [_gpu_line(gpu) for gpu in data["gpus"]]
    gpus += [_service_line(service) for service in data.get("services", [])[:MAX_SERVICES]]
    # title, GPU and service lines, a blank line, the jobs' header, the keys line
    rows = max(1, height - len(gpus) - 4)
    footer = Text("q quit", style="bright_black")
    return Group(title, *gpus, Text(""), _jobs(data["jobs"], rows), footer)
