"""`gpupool service ...`: model services on the node's GPUs (HTTP client of /v1/services).

It parses with argparse, not typer (cli/plain.py says why).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from gpupool.api.client import Client
from gpupool.cli import jobs_cmd, options, plain, service_view
from gpupool.core.errors import InvalidRequest
from gpupool.core.units import parse_duration

HELP = (
    "Model services: replicas kept up, routed by `gpupool serve --router`, scaled with their "
    "traffic.\n\nA service's command serves HTTP on $PORT (gpupool picks it); each replica is a "
    "job of the pool with the share given here. See docs/inference.md."
)


def _replicas(text: str) -> tuple[int, int]:
    from gpupool.agent.services import parse_replicas  # pure; kept out of `ps`'s imports

    return parse_replicas(text)


def _seconds(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except InvalidRequest as err:
        raise InvalidRequest(f"{option}: {err}") from None


def _keep_alive(text: str) -> float:
    """`--keep-alive`: a duration, `0` (park at once) or `-1` (resident for good)."""
    if text.strip() in ("0", "-1"):
        return float(text)
    try:
        return parse_duration(text)
    except InvalidRequest as err:
        raise InvalidRequest(f"--keep-alive: {err}; or 0 (parked at once), -1 (for good)") from None


def _share(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    """The options create and update share, those given, into `body`."""
    plain.share_into(args, body)
    if args.concurrency is not None and args.concurrency < 1:
        raise InvalidRequest(f"invalid --concurrency {args.concurrency}: at least 1")
    for key in ("mode", "priority", "concurrency", "health"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    for key, option in (("idle", "--idle"), ("window", "--window")):
        seconds = _seconds(getattr(args, key), option)
        if seconds is not None:
            body[f"{key}_s"] = seconds
    if args.keep_alive is not None:
        body["keep_alive_s"] = _keep_alive(args.keep_alive)
    ready = _seconds(args.ready_timeout, "--ready-timeout")
    if ready is not None:
        body["ready_timeout_s"] = ready
    if args.env:
        body["env"] = plain.env_pairs(args.env)
    if args.model:
        body["models"] = args.model
    command = args.command
    if command:
        body["argv"] = command
        body["workdir"] = os.path.abspath(args.workdir or os.getcwd())
    return body


def _create(args: argparse.Namespace) -> int:
    low, high = _replicas(args.replicas)
    body = _share(args, {"name": args.name, "min_replicas": low, "max_replicas": high})
    if "argv" not in body:
        raise InvalidRequest(
            "no command given: gpupool service create NAME [OPTIONS] -- CMD [ARGS]..."
        )
    with Client(args.url) as client:
        service = client.call("POST", "/v1/services", json=body)["service"]
    _done(args, service, f"service {service['name']} created ({low}..{high} replicas)")
    return 0


def _ls(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        services = client.call("GET", "/v1/services")["services"]
    if args.json:
        plain.echo_json({"services": services})
    else:
        service_view.print_services(services)
    return 0


def _describe(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        service = client.call("GET", f"/v1/services/{_name(args.name)}")
    if args.json:
        plain.echo_json(service)
    else:
        service_view.print_service(service)
    return 0


def _scale(args: argparse.Namespace) -> int:
    low, high = _replicas(args.replicas)
    body = {"min_replicas": low, "max_replicas": high}
    with Client(args.url) as client:
        service = client.call("POST", f"/v1/services/{_name(args.name)}/scale", json=body)
    _done(args, service["service"], f"service {args.name}: {low}..{high} replicas")
    return 0


def _update(args: argparse.Namespace) -> int:
    body = _share(args, {})
    if not body:
        raise InvalidRequest("nothing to update: give options, or -- CMD [ARGS]...")
    with Client(args.url) as client:
        service = client.call("POST", f"/v1/services/{_name(args.name)}/update", json=body)
    generation = service["service"]["generation"]
    _done(args, service["service"], f"service {args.name}: rolling to generation {generation}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        service = client.call("DELETE", f"/v1/services/{_name(args.name)}", json={})
    _done(args, service["service"], f"service {args.name} deleted (its replicas drain, then stop)")
    return 0


def _logs(args: argparse.Namespace) -> int:
    path = f"/v1/services/{_name(args.name)}/logs"
    offsets = {"stdout": 0, "stderr": 0}
    with Client(args.url) as client:
        while True:
            finished = True
            for stream, sink in (("stdout", sys.stdout), ("stderr", sys.stderr)):
                params = {"replica": args.replica, "stream": stream, "offset": offsets[stream]}
                chunk = client.call("GET", path, params=params)
                if chunk["data"]:
                    sink.write(chunk["data"])
                    sink.flush()
                args.replica = chunk["replica"]  # stay on the replica first shown
                finished &= chunk["offset"] == offsets[stream] and (
                    bool(chunk["finished"]) or not args.follow
                )
                offsets[stream] = chunk["offset"]
            if finished:
                return 0
            time.sleep(jobs_cmd.POLL_S)


def _name(name: str) -> str:
    """A name as a URL path segment: one that could not be a service's is refused here."""
    if not name or "/" in name or name in (".", "..") or not name.isprintable():
        raise InvalidRequest(f"invalid service name {name[:60]!r}")
    from urllib.parse import quote

    return quote(name, safe="")


def _done(args: argparse.Namespace, service: dict[str, Any], line: str) -> None:
    plain.answer(args, {"service": service}, line)


def _share_options(parser: argparse.ArgumentParser) -> None:
    options.add(parser, options.MEMORY)
    options.add(parser, options.COMPUTE)
    parser.add_argument(
        "--mode",
        metavar="shim|mps",
        help="How a replica shares its GPU. shim (default): in turns, parked in host memory at "
        "zero; mps: its kernels beside other services' (online services sharing a GPU keep "
        "their latency), not parked.",
    )
    options.add(parser, options.PRIORITY)
    parser.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="Requests in flight per replica: the autoscaler's target and the router's cap "
        "(default 4).",
    )
    parser.add_argument(
        "--idle",
        metavar="DURATION",
        help="With MIN 0: no request for this long and it goes to zero replicas (default 5m).",
    )
    parser.add_argument(
        "--keep-alive",
        metavar="DURATION",
        help="With MIN 0: how long an idle replica stays on its GPU after its last request "
        "when no other service needs the memory (then it is parked in host memory); 0: parked "
        "at once; -1: resident for good, never parked nor swapped out (default: --idle).",
    )
    parser.add_argument(
        "--window",
        metavar="DURATION",
        help="Replicas are taken away only after this long at lower load (default 30s).",
    )
    parser.add_argument(
        "--ready-timeout",
        metavar="DURATION",
        help="A new replica that does not pass its health check within this long has failed "
        "(default 2m).",
    )
    parser.add_argument(
        "--health", metavar="PATH", help="Its health check: GET PATH answers 2xx (default /health)."
    )
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="Repeatable.")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="A model name it answers for at the router's OpenAI API (/v1/chat/completions "
        "routes by the body's model); repeatable (aliases); default: the service's name.",
    )
    parser.add_argument("--workdir", metavar="DIR", help="Where it runs (default: here).")
    parser.set_defaults(command=[])


def _with_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")


def _common(parser: argparse.ArgumentParser) -> None:
    options.add(parser, options.URL)
    options.add(parser, options.JSON)


class _Parser(argparse.ArgumentParser):
    """argparse, with what follows `--` taken whole as the service's command (argparse's
    REMAINDER after a subcommand's positional would swallow the options too)."""

    def parse_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        given = list(sys.argv[1:] if args is None else args)
        rest: list[str] = []
        if "--" in given:
            at = given.index("--")
            given, rest = given[:at], given[at + 1 :]
        parsed = super().parse_args(given, namespace)
        if rest and getattr(parsed, "action", None) not in ("create", "update"):
            self.error(f"{parsed.action} takes no command after --")
        parsed.command = rest
        return parsed


def parser(name: str) -> argparse.ArgumentParser:
    """The parser of `gpupool service`, each subcommand's run function as `run`."""
    summary, _, more = HELP.partition("\n\n")
    command = _Parser(prog=f"gpupool {name}", description=summary, epilog=more)
    command.set_defaults(run=lambda _args: 2)
    sub = command.add_subparsers(dest="action", metavar="COMMAND", required=True)
    create = sub.add_parser("create", help="Create a service: NAME --replicas MIN..MAX -- CMD.")
    _with_name(create)
    create.add_argument(
        "--replicas", default="1", metavar="MIN..MAX", help="N or MIN..MAX (default 1)."
    )
    _share_options(create)
    create.set_defaults(run=_create)
    listing = sub.add_parser("ls", help="The services, their replicas and traffic.")
    listing.set_defaults(run=_ls)
    describe = sub.add_parser("describe", help="A service: share, replicas, events, problems.")
    _with_name(describe)
    describe.set_defaults(run=_describe)
    scale = sub.add_parser("scale", help="New replica bounds: NAME MIN..MAX.")
    _with_name(scale)
    scale.add_argument("replicas", metavar="MIN..MAX")
    scale.set_defaults(run=_scale)
    update = sub.add_parser(
        "update", help="Change a service: its replicas roll, a new one ready before an old stops."
    )
    _with_name(update)
    _share_options(update)
    update.set_defaults(run=_update)
    delete = sub.add_parser("delete", help="Delete a service (its replicas drain, then stop).")
    _with_name(delete)
    delete.set_defaults(run=_delete)
    logs = sub.add_parser("logs", help="A replica's output (stdout here, stderr on stderr).")
    _with_name(logs)
    logs.add_argument("--replica", type=int, metavar="N", help="Which replica (default: first).")
    logs.add_argument("-f", "--follow", action="store_true", help="Until the replica ends.")
    logs.set_defaults(run=_logs)
    for each in (create, listing, describe, scale, update, delete, logs):
        _common(each)
    return command
