"""The daemon's client commands (cli/jobs_cmd.py, cli/events_cmd.py) and `gpupool gpus` parse
with argparse.

The other commands are typer commands, but typer builds a pydantic validator for each parameter
it parses, and importing typer and pydantic takes several times what a whole `gpupool ps` may
(150 ms; docs/benchmarks/cli.md), while argparse comes with Python and costs a few milliseconds.
Their options shared with typer commands come from cli/options.py, declared once for both.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

#: what a command does with its parsed arguments; its exit status
Run = Callable[[argparse.Namespace], int]


def parser(name: str, text: str, run: Run) -> argparse.ArgumentParser:
    """The parser of `gpupool NAME`: `text` is its line for `gpupool --help`, then a blank line
    and more for its own --help; `run` is kept as the parsed arguments' `run`."""
    summary, _, more = text.partition("\n\n")
    command = argparse.ArgumentParser(
        prog=f"gpupool {name}", description=summary, epilog=more or None
    )
    command.set_defaults(run=run)
    return command
