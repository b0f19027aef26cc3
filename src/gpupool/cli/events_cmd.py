"""`gpupool events`: what the daemon's watchdog found (processes of no job, exempt or not, and
jobs over share)."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import typer

from gpupool.api.client import Client
from gpupool.cli import options
from gpupool.core.errors import InvalidRequest


def _line(event: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(event["at"]).strftime("%Y-%m-%d %H:%M:%S")
    where = f"job {event['job_id']}" if event["job_id"] is not None else "node"
    return f"{when}  {where:<8}  {event['kind']:<13}  {event['detail']}"


def register(app: typer.Typer) -> None:
    """Add `events` to the app."""

    @app.command("events")
    def events(
        since: float | None = typer.Option(
            None, "--since", metavar="SECONDS", help="Only the last SECONDS (default: all)."
        ),
        limit: int = typer.Option(100, "--limit", metavar="N", help="At most the newest N."),
        url: str | None = options.URL,
        as_json: bool = options.JSON,
    ) -> None:
        """The watchdog's events: GPU processes of no job, jobs over their memory share, kills.

        Processes of no job that are exempt from the watchdog are listed too.
        """
        if since is not None and since < 0:
            raise InvalidRequest(f"invalid --since {since:g}: must not be negative")
        params: dict[str, Any] = {"limit": limit}
        if since is not None:
            params["since"] = time.time() - since
        with Client(url) as client:
            answer = client.call("GET", "/v1/events", params=params)
        if as_json:
            typer.echo(json.dumps(answer, indent=2))
            return
        typer.echo(f"watchdog action: {answer['action']}")
        for event in answer["events"]:
            typer.echo(_line(event))
        if not answer["events"]:
            typer.echo("(no events)")
