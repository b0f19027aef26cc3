"""The list of command modules; each module's `register(app)` adds its commands."""

from __future__ import annotations

import typer


def all_commands(app: typer.Typer) -> None:
    """Add every command group to `app` (one line per module keeps merges trivial)."""
    from gpupool.cli import (
        events_cmd,
        exec_cmd,
        gpus_cmd,
        jobs_cmd,
        k8s_cmd,
        mig_cmd,
        prune_cmd,
        serve_cmd,
        sim_cmd,
        top_cmd,
        version_cmd,
    )

    version_cmd.register(app)
    gpus_cmd.register(app)
    mig_cmd.register(app)
    exec_cmd.register(app)
    sim_cmd.register(app)
    serve_cmd.register(app)
    jobs_cmd.register(app)
    k8s_cmd.register(app)
    events_cmd.register(app)
    top_cmd.register(app)
    prune_cmd.register(app)
