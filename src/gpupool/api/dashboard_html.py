"""The dashboard's HTML, rendered on the server from `dashboard.dashboard_data`.

Every value from a job (its name, user, events' details) goes through `html.escape`. The style
sheet and the polling script are package files (`static/`), put inline in the page: nothing is
fetched from anywhere else.
"""

from __future__ import annotations

import time
from html import escape
from importlib import resources
from typing import Any

from gpupool.api.dashboard_services import services_html
from gpupool.core.units import format_bytes

#: colours of jobs' segments, chosen by job id (readable with white text)
PALETTE = ("#2f6fb3", "#c0562b", "#3a8f4b", "#8a4fb0", "#b0892a", "#2a8f8f", "#b03a6a", "#5a6b7d")
CHART_W, CHART_H = 600, 140
REFRESH_MS = 2000


def _static(name: str) -> str:
    return resources.files("gpupool.api").joinpath("static", name).read_text()


def _colour(job_id: int) -> str:
    return PALETTE[job_id % len(PALETTE)]


def _percent(part: float, whole: float) -> float:
    return max(0.0, min(100.0, 100.0 * part / whole)) if whole else 0.0


def _clock(at: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if at else ""


def _segment(job: dict[str, Any], width: float, fill: float, label: str, over: bool) -> str:
    title = f"job {job['id']} {job['name']} ({job['user']}): {label}"
    return (
        f'<div class="seg{" over" if over else ""}" style="width:{width:.2f}%;'
        f'--c:{_colour(job["id"])}" title="{escape(title)}">'
        f'<div class="fill" style="width:{fill:.1f}%"></div>'
        f'<span class="seg-label">{escape(job["name"])} {escape(label)}</span></div>'
    )


def _gpu(gpu: dict[str, Any]) -> str:
    total = gpu["memory_total"] or 1
    memory_segments, compute_segments = [], []
    jobs_used = 0
    for job in gpu["jobs"]:
        used, share = job["memory_used"], job["memory_share"]
        jobs_used += used
        label = f"{format_bytes(used)}/{format_bytes(share)}"
        memory_segments.append(
            _segment(job, _percent(share, total), _percent(used, share), label, used > share)
        )
        util, cshare = job["compute_used"], job["compute_share"]
        shown = "?" if util is None else f"{util}"
        compute_segments.append(
            _segment(
                job,
                cshare,
                _percent(util or 0, cshare),
                f"{shown}%/{cshare}%",
                (util or 0) > cshare,
            )
        )
    other = max(0, gpu["memory_used"] - jobs_used)
    if other:  # memory held by processes of no job: shown, never hidden
        memory_segments.append(
            f'<div class="seg other" style="width:{_percent(other, total):.2f}%" '
            f'title="held by processes of no job: {format_bytes(other)}">'
            f'<span class="seg-label">other {format_bytes(other)}</span></div>'
        )
    facts = [gpu["model"], f"{gpu['utilization']}% busy" if gpu["utilization"] is not None else ""]
    if gpu["temperature"] is not None:
        facts.append(f"{gpu['temperature']} °C")
    if gpu["power_w"] is not None:
        facts.append(f"{gpu['power_w']:.0f} W")
    health = "" if gpu["healthy"] else '<span class="badge bad">unhealthy</span>'
    return (
        f'<section class="gpu" data-gpu="{gpu["index"]}">'
        f"<h3>GPU {gpu['index']} <small>{escape(' · '.join(f for f in facts if f))}</small>"
        f"{health}</h3>"
        f'<div class="bar-row"><span class="bar-name">memory</span><div class="bar">'
        f"{''.join(memory_segments)}</div>"
        f'<span class="bar-total">{format_bytes(gpu["memory_used"])} of '
        f"{format_bytes(gpu['memory_total'])}</span></div>"
        f'<div class="bar-row"><span class="bar-name">compute</span><div class="bar">'
        f"{''.join(compute_segments)}</div>"
        f'<span class="bar-total">{sum(j["compute_share"] for j in gpu["jobs"])}% shared</span>'
        f"</div></section>"
    )


def gpus_html(data: dict[str, Any]) -> str:
    if not data["gpus"]:
        return '<p class="empty">no GPU</p>'
    return "".join(_gpu(gpu) for gpu in data["gpus"])


def _bytes(value: int | None) -> str:
    return "&ndash;" if value is None else format_bytes(value)


def jobs_html(data: dict[str, Any]) -> str:
    if not data["jobs"]:
        return '<p class="empty">no queued or running job</p>'
    rows = []
    for job in data["jobs"]:
        gpus = ",".join(str(g) for g in job["gpus"]) or f"({job['gpu_count']})"
        util = "&ndash;" if job["compute_used"] is None else f"{job['compute_used']}%"
        rows.append(
            f'<tr data-job="{job["id"]}" class="{job["state"]}">'
            f'<td><a href="/jobs/{job["id"]}">{job["id"]}</a></td>'
            f'<td><span class="dot" style="background:{_colour(job["id"])}"></span>'
            f"{escape(job['name'])}</td><td>{escape(job['user'])}</td>"
            f'<td><span class="badge {job["state"]}">{job["state"]}</span></td>'
            f"<td>{gpus}</td>"
            f"<td>{_bytes(job['memory_used'])} / {_bytes(job['memory_share'])}"
            + (f" ({_bytes(job['memory_host'])} in host memory)" if job.get("memory_host") else "")
            + "</td>"
            f"<td>{util} / {job['compute_share']}%</td>"
            f"<td>{job['priority']}</td><td>{job['mode']}</td>"
            f"<td>{_clock(job['started_at'] or job['submitted_at'])}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "id",
            "name",
            "user",
            "state",
            "GPUs",
            "memory used / share",
            "compute used / share",
            "priority",
            "mode",
            "since",
        )
    )
    return (
        f'<table class="jobs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def history_html(data: dict[str, Any]) -> str:
    """Utilisation per GPU over the ring's minutes, as an inline SVG chart."""
    at, rows = data["history"]["at"], data["history"]["utilization"]
    if len(at) < 2:
        return '<p class="empty">collecting…</p>'
    start, span = at[0], max(1e-9, at[-1] - at[0])
    lines, legend = [], []
    for index in range(len(rows[-1])):
        points = " ".join(
            f"{(t - start) / span * CHART_W:.1f},{CHART_H - (row[index] or 0) / 100 * CHART_H:.1f}"
            for t, row in zip(at, rows, strict=True)
            if index < len(row)
        )
        colour = PALETTE[index % len(PALETTE)]
        lines.append(f'<polyline points="{points}" style="stroke:{colour}"/>')
        legend.append(f'<span><i style="background:{colour}"></i>GPU {index}</span>')
    grid = "".join(
        f'<line x1="0" x2="{CHART_W}" y1="{y}" y2="{y}"/>'
        for y in (CHART_H * (1 - p / 100) for p in (25, 50, 75))
    )
    minutes = span / 60
    return (
        f'<svg viewBox="0 0 {CHART_W} {CHART_H}" preserveAspectRatio="none" class="chart">'
        f'<g class="grid">{grid}</g><g class="lines">{"".join(lines)}</g></svg>'
        f'<div class="legend">{"".join(legend)}<span class="span">last {minutes:.1f} min, '
        f"0-100 %</span></div>"
    )


def _source(event: dict[str, Any]) -> str:
    """A link to the event's job, or "node" for an event of no job (job_id None)."""
    if event.get("job_id") is None:
        return '<span class="node">node</span>'
    return f'<a href="/jobs/{event["job_id"]}">job {event["job_id"]}</a>'


def events_html(data: dict[str, Any]) -> str:
    if not data["events"]:
        return '<p class="empty">no events yet</p>'
    rows = "".join(
        f'<li class="event {escape(e["kind"])}"><time>{_clock(e["at"])}</time>{_source(e)}'
        f'<span class="badge {escape(e["kind"])}">{escape(e["kind"])}</span>'
        f"<span>{escape(e['detail'])}</span></li>"
        for e in data["events"]
    )
    return f'<ol class="events">{rows}</ol>'


def status_html(data: dict[str, Any]) -> str:
    bits = [f"policy {escape(data['policy'])}"]
    if data["simulated"]:
        bits.append('<span class="badge sim">simulated node</span>')
    if data["draining"]:
        bits.append('<span class="badge bad">draining</span>')
    bits.append(f'updated <time id="updated">{_clock(data["time"])}</time>')
    return " · ".join(bits)


def parts(data: dict[str, Any]) -> dict[str, str]:
    """The page's live parts, by element id (what the script swaps in)."""
    return {
        "status": status_html(data),
        "gpus": gpus_html(data),
        "jobs": jobs_html(data),
        "history": history_html(data),
        "events": events_html(data),
        "services": services_html(data),
    }


def _document(title: str, body: str, script: str = "") -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_static('dashboard.css')}</style></head>"
        f"<body>{body}{script}</body></html>"
    )


def page(data: dict[str, Any]) -> str:
    live = parts(data)
    body = (
        f'<header><h1>gpupool</h1><div id="status">{live["status"]}</div></header><main>'
        f'<section class="panel wide"><h2>GPUs</h2><div id="gpus">{live["gpus"]}</div></section>'
        f'<section class="panel"><h2>Utilisation</h2><div id="history">{live["history"]}</div>'
        f'</section><section class="panel"><h2>Recent events</h2>'
        f'<div id="events">{live["events"]}</div></section>'
        f'<section class="panel wide"><h2>Jobs</h2><div id="jobs">{live["jobs"]}</div></section>'
        f'<section class="panel wide"><h2>Services</h2><div id="services">{live["services"]}'
        "</div></section></main>"
    )
    script = (
        f"<script>const REFRESH_MS = {REFRESH_MS};</script>"
        f"<script>{_static('dashboard.js')}</script>"
    )
    return _document("gpupool", body, script)


def job_page(job: dict[str, Any]) -> str:
    """One job, as `gpupool describe` shows it, with its events."""
    facts = "".join(
        f"<tr><th>{key}</th><td>{escape(str(job.get(key)))}</td></tr>"
        for key in ("state", "user", "gpus", "memory", "compute", "priority", "mode", "command")
    )
    waiting = "".join(f"<li>{escape(line)}</li>" for line in job.get("waiting", []))
    events = "".join(
        f'<li><time>{_clock(e["at"])}</time><span class="badge {escape(e["kind"])}">'
        f"{escape(e['kind'])}</span><span>{escape(e['detail'])}</span></li>"
        for e in job["events"]
    )
    body = (
        f'<header><h1><a href="/">gpupool</a> · job {job["id"]} {escape(job["name"])}</h1>'
        f'</header><main><section class="panel wide"><table class="facts">{facts}</table>'
        f"{f'<h2>Waiting</h2><ul>{waiting}</ul>' if waiting else ''}"
        f'<h2>Events</h2><ol class="events">{events}</ol></section></main>'
    )
    return _document(f"gpupool job {job['id']}", body)
