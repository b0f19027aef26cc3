"""The daemon's client commands (cli/jobs_cmd.py, cli/events_cmd.py) and `gpupool gpus` parse
with argparse.

The other commands are typer commands, but typer builds a pydantic validator for each parameter
it parses, and importing typer and pydantic takes several times what a whole `gpupool ps` may
(150 ms; docs/benchmarks/cli.md), while argparse comes with Python and costs a few milliseconds.
Their options shared with typer commands come from cli/options.py, declared once for both; what
the client commands share beyond that (a table of commands, a JSON or one-line answer, the
`--env` pairs and share options they send) is here, written once for all of them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from gpupool.cli import options
from gpupool.cli.lines import say
from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MILLI_PER_GPU, parse_compute_percent, parse_memory_share

#: what a command does with its parsed arguments; its exit status
Run = Callable[[argparse.Namespace], int]
#: what adds a command's own arguments to its parser
Arguments = Callable[[argparse.ArgumentParser], None]
#: name -> (its help: a line, then more; its own arguments; what it does)
Commands = dict[str, tuple[str, Arguments, Run]]


def parser(name: str, text: str, run: Run) -> argparse.ArgumentParser:
    """The parser of `gpupool NAME`: `text` is its line for `gpupool --help`, then a blank line
    and more for its own --help; `run` is kept as the parsed arguments' `run`."""
    summary, _, more = text.partition("\n\n")
    command = argparse.ArgumentParser(
        prog=f"gpupool {name}", description=summary, epilog=more or None
    )
    command.set_defaults(run=run)
    return command


def client_parser(commands: Commands, name: str) -> argparse.ArgumentParser:
    """The parser of the daemon client command `name` of `commands`, with --url and --json."""
    text, arguments, run = commands[name]
    command = parser(name, text, run)
    arguments(command)
    options.add(command, options.URL)
    options.add(command, options.JSON)
    return command


def job_argument(command: argparse.ArgumentParser) -> None:
    """The one job a command acts on, by its id."""
    command.add_argument("job", type=int, metavar="JOB")


def echo_json(data: object) -> None:
    say(json.dumps(data, indent=2))


def answer(args: argparse.Namespace, data: object, line: str) -> None:
    """The daemon's answer under --json, else one line saying what was done."""
    if args.json:
        echo_json(data)
    else:
        say(line)


def env_pairs(pairs: list[str]) -> dict[str, str]:
    """The variables of repeated `--env KEY=VALUE` options."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"invalid --env {pair!r}: use KEY=VALUE")
        env[key] = value
    return env


def share_into(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    """--memory and --compute, those given, into `body` (compute in whole percent); bad input
    stops here, before the daemon is asked."""
    if args.memory is not None:
        parse_memory_share(args.memory)
        body["memory"] = args.memory
    if args.compute is not None:
        body["compute"] = parse_compute_percent(args.compute) * 100 // MILLI_PER_GPU
    return body
