"""`gpupool version`: the package version (`gpupool version` alone never reaches typer)."""

from __future__ import annotations

import typer

from gpupool.cli.main import version_line


def register(app: typer.Typer) -> None:
    """Add `version` to the app."""

    @app.command("version")
    def version() -> None:
        """Print the gpupool version."""
        typer.echo(version_line())
