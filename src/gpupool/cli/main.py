"""The `gpupool` command: one typer app; each command group lives in its own module."""

from __future__ import annotations

import os
import sys

import typer

from gpupool import __version__
from gpupool.core import settings
from gpupool.core.errors import GpupoolError

app = typer.Typer(
    name="gpupool",
    help="Share and pool NVIDIA GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpupool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Share and pool NVIDIA GPUs."""


def _register_commands() -> None:
    """Import the command modules; each adds its commands to `app`."""
    # Imported here, not at the top, so that `app` exists when they register.
    from gpupool.cli import register

    register.all_commands(app)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps gpupool errors to one line on stderr and an exit code.

    typer (standalone mode) prints usage errors itself and exits 2; anything else that escapes a
    command is turned into one line here, so no traceback reaches a user.
    """
    _register_commands()
    try:
        app(args=argv, prog_name="gpupool")
    except GpupoolError as err:
        typer.echo(f"gpupool: error: {err}", err=True)
        sys.exit(err.exit_code)
    except Exception as err:  # the last line of defence
        if settings.DEBUG.read(os.environ):
            raise
        typer.echo(
            f"gpupool: internal error: {type(err).__name__}: {err} "
            "(set GPUPOOL_DEBUG=1 for the traceback)",
            err=True,
        )
        sys.exit(70)
