"""`gpupool events`: what the daemon's watchdog found (processes of no job, exempt or not, and
jobs over share). It parses with argparse, not typer (cli/plain.py says why)."""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import Any

from gpupool.api.client import Client
from gpupool.cli import options, plain
from gpupool.cli.lines import say
from gpupool.core.errors import InvalidRequest


def _line(event: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(event["at"]).strftime("%Y-%m-%d %H:%M:%S")
    where = f"job {event['job_id']}" if event["job_id"] is not None else "node"
    return f"{when}  {where:<8}  {event['kind']:<13}  {event['detail']}"


def _events(args: argparse.Namespace) -> int:
    if args.since is not None and args.since < 0:
        raise InvalidRequest(f"invalid --since {args.since:g}: must not be negative")
    params: dict[str, Any] = {"limit": args.limit}
    if args.since is not None:
        params["since"] = time.time() - args.since
    with Client(args.url) as client:
        answer = client.call("GET", "/v1/events", params=params)
    if args.json:
        plain.echo_json(answer)
        return 0
    say(f"watchdog action: {answer['action']}")
    for event in answer["events"]:
        say(_line(event))
    if not answer["events"]:
        say("(no events)")
    return 0


def parser(name: str) -> argparse.ArgumentParser:
    """The parser of `events`, its run function as `run`."""
    command = plain.parser(
        name,
        "The watchdog's events: GPU processes of no job, jobs over their memory share, kills.\n\n"
        "Processes of no job that are exempt from the watchdog are listed too.",
        _events,
    )
    command.add_argument(
        "--since", type=float, metavar="SECONDS", help="Only the last SECONDS (default: all)."
    )
    command.add_argument(
        "--limit", type=int, default=100, metavar="N", help="At most the newest N."
    )
    options.add(command, options.URL)
    options.add(command, options.JSON)
    return command
