"""The list of command modules; each module's `register(app)` adds its commands."""

from __future__ import annotations

import typer


def all_commands(app: typer.Typer) -> None:
    """Add every command group to `app` (one line per module keeps merges trivial)."""
    from gpupool.cli import version_cmd

    version_cmd.register(app)
    from gpupool.cli import sim_cmd

    sim_cmd.register(app)
