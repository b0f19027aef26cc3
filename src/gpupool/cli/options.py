"""The options several commands share, each declared once with its one help text.

Most commands are typer commands and take an option as their parameter's default
(`simulate: str | None = options.typer_option(options.SIMULATE)`); the daemon's client commands
and `gpus` parse with argparse (cli/plain.py says why) and add it to their parser
(`options.add(parser, options.URL)`). What differs between commands (a default that depends on
another option) is said in the command's own help, not in a second declaration of the option.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One option: its names, what it stands for in the usage line, its help and default."""

    names: tuple[str, ...]
    help: str
    metavar: str | None = None  # None: an on/off flag (False unless given)

    @property
    def dest(self) -> str:
        return self.names[0].removeprefix("--").replace("-", "_")


SIMULATE = Flag(
    ("--simulate",),
    "Simulated GPUs: 8xH100-80GB, 4xA30-24GB,2xA100-40GB or an inventory YAML.",
    "SPEC",
)
NODE_DIR = Flag(("--node-dir",), "The simulated node's directory.", "DIR")
MEMORY = Flag(("--memory",), "GPU memory per GPU: 4Gi (2^30), 4G (10^9) or 50%.", "SIZE")
COMPUTE = Flag(
    ("--compute",),
    "Compute share per GPU, a whole percent 1..100 (30 or 30%; default 100).",
    "PERCENT",
)
PRIORITY = Flag(
    ("--priority",),
    "high (default): guaranteed; low: only while no high share on the GPU has work.",
    "high|low",
)
URL = Flag(
    ("--url",),
    "The node daemon: unix:///path.sock or http(s)://host:port (default: $GPUPOOL_URL, else "
    "the default state dir's socket).",
    "URL",
)
JSON = Flag(("--json",), "Print JSON.")


def typer_option(flag: Flag) -> Any:
    """`flag` as a typer command's parameter default."""
    import typer  # only typer commands pay for it

    if flag.metavar is None:
        return typer.Option(False, *flag.names, help=flag.help)
    return typer.Option(None, *flag.names, metavar=flag.metavar, help=flag.help)


def add(parser: argparse.ArgumentParser, flag: Flag, required: bool = False) -> None:
    """`flag` added to an argparse command's parser (`required`: a value the command needs)."""
    if flag.metavar is None:
        parser.add_argument(*flag.names, dest=flag.dest, action="store_true", help=flag.help)
    else:
        # argparse expands % in help texts
        text = flag.help.replace("%", "%%")
        parser.add_argument(
            *flag.names, dest=flag.dest, metavar=flag.metavar, help=text, required=required
        )
