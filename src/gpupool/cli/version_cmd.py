"""`gpupool version`: the package version and where its native libraries are."""

from __future__ import annotations

import typer

from gpupool import __version__


def register(app: typer.Typer) -> None:
    """Add `version` to the app."""

    @app.command("version")
    def version() -> None:
        """Print the gpupool version."""
        typer.echo(f"gpupool {__version__}")
