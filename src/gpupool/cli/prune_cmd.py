"""`gpupool prune`: delete the daemon's finished jobs, their events and directories (admins)."""

from __future__ import annotations

import typer

from gpupool.api.client import Client
from gpupool.core.units import parse_duration


def register(app: typer.Typer) -> None:
    """Add `prune` to the app."""

    @app.command("prune")
    def prune(
        older_than: str = typer.Option(
            ...,
            "--older-than",
            metavar="DURATION",
            help="Jobs that finished longer ago than this: 7d, 12h, 30m, 0s (every finished job).",
        ),
        url: str | None = typer.Option(
            None, "--url", metavar="URL", help="The daemon (default: $GPUPOOL_URL)."
        ),
    ) -> None:
        """Delete finished jobs, with their events, logs and directories (for admins; the
        daemon also does it by itself two weeks after a job ends)."""
        seconds = parse_duration(older_than)
        with Client(url) as client:
            answer = client.call("POST", "/v1/prune", json={"older_than_s": seconds})
        count = int(answer["pruned"])
        typer.echo(
            f"pruned {count} job{'' if count == 1 else 's'} finished more than {older_than} ago"
        )
