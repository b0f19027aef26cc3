"""Write docs/cli.md from the `--help` of `gpupool` and of every command and subcommand.

The commands are those `gpupool --help` lists (cli/main.py's COMMANDS), a typer group's
subcommands included, so a new command appears in the reference without a change here. Each help
text is rendered in this process, at 100 columns, without colours or a terminal: a typer
command's through click's test runner, an argparse command's by its parser. So the output is
the same on every machine; tests/test_cli_reference.py renders it again and compares.

Usage: python tools/cli_reference.py [--check] [OUTPUT]   (default OUTPUT: docs/cli.md)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cli.md"
COLUMNS = 100
#: what the help is rendered under: no colour, no terminal, a fixed width
ENV = {
    "COLUMNS": str(COLUMNS),
    "LINES": "50",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "FORCE_COLOR": None,
    "PY_COLORS": None,
    "GITHUB_ACTIONS": None,
    "TERMINAL_WIDTH": None,
}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

HEADER = """\
# Command-line reference

Generated from `gpupool --help` and each command's `--help` by `make cli-docs`
(tools/cli_reference.py); do not edit by hand: a test compares this page with the commands.
Exit codes: [exit-codes.md](exit-codes.md). A guided tour: [usage.md](usage.md).
"""


def _app() -> typer.Typer:
    """The `gpupool` app of the typer commands (each module imported when looked up)."""
    from gpupool.cli import main

    return main.build_app()


def _argparse_help(name: str) -> str | None:
    """`gpupool NAME --help` of a command that parses with argparse; None for a typer one."""
    from gpupool.cli import main

    entry = main.COMMANDS[name]
    if not entry.argparse:
        return None
    module = importlib.import_module(f"gpupool.cli.{entry.module}")
    text: str = module.parser(name).format_help()
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def _walk(command: Any, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """Every visible command path under a group, in the order its `--help` lists them."""
    ctx = typer.Context(command, info_name="gpupool")
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is None or sub.hidden:
            continue
        yield (*path, name)
        if hasattr(sub, "list_commands"):  # a group: `gpupool mig`, `gpupool k8s`
            yield from _walk(sub, (*path, name))


def _help(runner: CliRunner, root: typer.Typer, path: tuple[str, ...]) -> str:
    result = runner.invoke(root, [*path, "--help"], prog_name="gpupool", env=ENV)
    if result.exit_code != 0:
        raise RuntimeError(f"gpupool {' '.join(path)} --help exited {result.exit_code}")
    lines = _ANSI.sub("", result.output).splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(line.rstrip() for line in lines)


@contextlib.contextmanager
def _plain_help() -> Iterator[None]:
    """typer reads TERMINAL_WIDTH, FORCE_COLOR and the like once, at import: pin what they set."""
    try:
        rich_utils = importlib.import_module("typer.rich_utils")
    except ImportError:  # no rich: typer prints click's plain help, which ENV settles
        yield
        return
    pinned = {"MAX_WIDTH": COLUMNS, "FORCE_TERMINAL": False, "COLOR_SYSTEM": None}
    saved = {name: getattr(rich_utils, name) for name in pinned if hasattr(rich_utils, name)}
    for name in saved:
        setattr(rich_utils, name, pinned[name])
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(rich_utils, name, value)


def render() -> str:
    """The whole page, as `make cli-docs` writes it."""
    # argparse wraps its help at $COLUMNS (shutil.get_terminal_size)
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)
    try:
        with _plain_help():
            return _render()
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _render() -> str:
    from gpupool.cli import main

    root = _app()
    runner = CliRunner()
    group = typer.main.get_command(root)
    paths: list[tuple[str, ...]] = []
    for name in main.COMMANDS:
        paths.append((name,))
        if not main.COMMANDS[name].argparse:
            sub = group.get_command(typer.Context(group, info_name="gpupool"), name)
            if hasattr(sub, "list_commands"):  # a group: `gpupool mig`, `gpupool k8s`
                paths += list(_walk(sub, (name,)))
    parts = [HEADER, "## Commands\n"]
    parts += [f"- [`gpupool {' '.join(p)}`](#{_anchor(p)})" for p in paths]
    parts.append(f"\n## gpupool\n\n```text\n{main.help_text()}\n```")
    for path in paths:
        level = "#" * (2 + min(len(path), 2))
        text = _argparse_help(path[0]) if len(path) == 1 else None
        if text is None:
            text = _help(runner, root, path)
        parts.append(f"\n{level} gpupool {' '.join(path)}\n\n```text\n{text}\n```")
    return "\n".join(parts) + "\n"


def _anchor(path: tuple[str, ...]) -> str:
    """The heading anchor GitHub gives `gpupool <path>`."""
    return "-".join(["gpupool", *path]).lower()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", type=Path, default=DOC)
    parser.add_argument("--check", action="store_true", help="exit 1 if OUTPUT is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run make cli-docs", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
