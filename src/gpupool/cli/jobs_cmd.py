"""The daemon's job commands: submit, ps, logs, cancel, wait, describe, drain (HTTP client).

They parse with argparse, not typer (cli/plain.py says why).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from gpupool.api.client import Client
from gpupool.cli import jobs_view, options, plain
from gpupool.cli.lines import say
from gpupool.core.errors import InvalidRequest, NotFound
from gpupool.core.units import parse_duration

POLL_S = 0.2


def follow(client: Client, job_id: int) -> dict[str, Any]:
    """Copy the job's output here until it ends; its final record."""
    offsets = {"stdout": 0, "stderr": 0}
    while True:
        finished = True
        for stream, sink in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            chunk = client.call(
                "GET",
                f"/v1/jobs/{job_id}/logs",
                params={"stream": stream, "offset": offsets[stream]},
            )
            if chunk["data"]:
                sink.write(chunk["data"])
                sink.flush()
            finished &= bool(chunk["finished"]) and chunk["offset"] == offsets[stream]
            offsets[stream] = chunk["offset"]
        if finished:
            return client.call("GET", f"/v1/jobs/{job_id}")
        time.sleep(POLL_S)


def _read_all(client: Client, job_id: int, stream: str) -> str:
    parts, offset = [], 0
    while True:
        chunk = client.call(
            "GET", f"/v1/jobs/{job_id}/logs", params={"stream": stream, "offset": offset}
        )
        parts.append(chunk["data"])
        if chunk["offset"] == offset:
            return "".join(parts)
        offset = chunk["offset"]


def _wait_for(client: Client, job_id: int) -> dict[str, Any]:
    while True:
        job = client.call("GET", f"/v1/jobs/{job_id}")
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(POLL_S)


def _code(job: dict[str, Any]) -> int:
    code = job.get("exit_code")
    if code is None:
        return 0 if job["state"] == "succeeded" else 1
    return int(code)


def _submit(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise InvalidRequest("no command to submit: gpupool submit [OPTIONS] -- CMD [ARGS]...")
    if args.gpus < 1:
        raise InvalidRequest(f"invalid --gpus {args.gpus}: must be at least 1")
    mode = args.mode or ("mig" if args.mig_profile is not None else "shim")
    # without --memory, the daemon gives the share of memory that --compute gives
    share = plain.share_into(args, {"memory": None, "compute": 100})
    models = [m.strip() for m in args.gpu_model.split(",") if m.strip()] if args.gpu_model else []
    body: dict[str, Any] = {
        "argv": command,
        "gpus": args.gpus,
        **share,
        "mode": mode,
        "gpu_models": models,
        "name": args.name,
        "env": plain.env_pairs(args.env),
        "workdir": os.path.abspath(args.workdir or os.getcwd()),
    }
    if args.priority is not None:  # else the daemon's default
        body["priority"] = args.priority
    body["mig_profile"] = args.mig_profile
    if args.memory_burst is not None:
        body["memory_burst"] = args.memory_burst
    with Client(args.url) as client:
        job = client.call("POST", "/v1/jobs", json=body)["job"]
        if not args.wait:
            if args.json:
                plain.echo_json({"job": job})
            else:
                say(job["id"])
            return 0
        final = follow(client, job["id"])
    if args.json:
        plain.echo_json({"job": final})
    return _code(final)


def _ps(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        jobs = client.call("GET", "/v1/jobs", params={"all": args.all})["jobs"]
        services = _services(client)
        slurm = _slurm_shares(client)
    if args.json:
        plain.echo_json({"jobs": jobs, "services": services, "slurm": slurm})
    else:
        jobs_view.print_jobs(jobs)
        if slurm:  # shares Slurm started on this node (docs/slurm.md)
            say()
            jobs_view.print_slurm_shares(slurm)
        if services:  # their replicas are among the jobs above, named SERVICE/REPLICA
            from gpupool.cli import service_view

            say()
            service_view.print_services(services)
    return 0


def _services(client: Client) -> list[dict[str, Any]]:
    """The daemon's services (none from a daemon older than services)."""
    try:
        return list(client.call("GET", "/v1/services")["services"])
    except NotFound:
        return []


def _slurm_shares(client: Client) -> list[dict[str, Any]]:
    """The Slurm jobs' shares (none from a daemon that is no Slurm node's)."""
    try:
        return list(client.call("GET", "/v1/slurm")["shares"])
    except NotFound:
        return []


def _logs(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        if args.follow and not args.json:
            follow(client, args.job)
            return 0
        texts = {stream: _read_all(client, args.job, stream) for stream in ("stdout", "stderr")}
    if args.json:
        plain.echo_json({"id": args.job, **texts})
        return 0
    sys.stdout.write(texts["stdout"])
    sys.stdout.flush()
    sys.stderr.write(texts["stderr"])
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        jobs = [client.call("POST", f"/v1/jobs/{j}/cancel", json={})["job"] for j in args.jobs]
    if args.json:
        plain.echo_json({"jobs": jobs})
    else:
        for job in jobs:
            say(f"job {job['id']}: cancel sent ({job['state']})")
    return 0


def _wait(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        jobs = [_wait_for(client, j) for j in args.jobs]
    if args.json:
        plain.echo_json({"jobs": jobs})
    return next((_code(j) for j in jobs if _code(j) != 0), 0)


def _describe(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        job = client.call("GET", f"/v1/jobs/{args.job}")
    if args.json:
        plain.echo_json(job)
    else:
        jobs_view.print_job(job)
    return 0


def _drain(args: argparse.Namespace) -> int:
    with Client(args.url) as client:
        node = client.call("POST", "/v1/drain", json={"on": not args.off})
    if args.json:
        plain.echo_json(node)
    elif node["draining"]:
        say("draining: nothing new starts; running jobs finish")
    else:
        say("not draining: queued jobs start as room frees")
    return 0


def _prune(args: argparse.Namespace) -> int:
    seconds = parse_duration(args.older_than)
    with Client(args.url) as client:
        answer = client.call("POST", "/v1/prune", json={"older_than_s": seconds})
    if args.json:
        plain.echo_json(answer)
        return 0
    count = int(answer["pruned"])
    plural = "" if count == 1 else "s"
    say(f"pruned {count} job{plural} finished more than {args.older_than} ago")
    return 0


def _submit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpus", type=int, default=1, metavar="N", help="GPUs (same share on each)."
    )
    options.add(parser, options.MEMORY)
    options.add(parser, options.COMPUTE)
    parser.add_argument(
        "--memory-burst",
        metavar="SIZE",
        help="Low priority: memory past --memory, host-backed, evicted first (e.g. 24Gi).",
    )
    parser.add_argument(
        "--mode", metavar="shim|mps|exclusive|mig", help="Default shim (mig with a profile)."
    )
    parser.add_argument(
        "--mig-profile", metavar="PROFILE", help="Mode mig: the instance, e.g. 1g.10gb."
    )
    options.add(parser, options.PRIORITY)
    parser.add_argument("--gpu-model", metavar="A100,H100", help="Only these GPU models.")
    parser.add_argument("--name", default="", help="A name to know the job by.")
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="Repeatable.")
    parser.add_argument("--workdir", metavar="DIR", help="Where it runs (default: here).")
    parser.add_argument(
        "--wait", action="store_true", help="Follow its output, exit with its code."
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD", help="The command.")


def _jobs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("jobs", type=int, nargs="+", metavar="JOB")


def _ps_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-a", "--all", action="store_true", help="Finished jobs too.")


def _logs_options(parser: argparse.ArgumentParser) -> None:
    plain.job_argument(parser)
    parser.add_argument("-f", "--follow", action="store_true", help="Until the job ends.")


def _drain_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--off", action="store_true", help="Start new jobs again.")


def _prune_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--older-than",
        required=True,
        metavar="DURATION",
        help="Jobs that finished longer ago than this: 7d, 12h, 30m, 0s (every finished job).",
    )


_COMMANDS: plain.Commands = {
    "submit": (
        "Queue a command on the node's GPUs; prints the job id.\n\nWithout --memory, a job "
        "gets the share of each GPU's memory that --compute gives it.",
        _submit_options,
        _submit,
    ),
    "ps": (
        "List the daemon's jobs (queued and running; --all for finished ones too).",
        _ps_options,
        _ps,
    ),
    "logs": ("Print a job's output (stdout here, stderr on stderr).", _logs_options, _logs),
    "cancel": (
        "Cancel jobs: SIGTERM to each job's process group, SIGKILL after a grace period.",
        _jobs,
        _cancel,
    ),
    "wait": (
        "Wait for jobs to end; exits with the first non-zero exit code, else 0.",
        _jobs,
        _wait,
    ),
    "describe": (
        "A job's share, placement, events and, while queued, why it waits.",
        plain.job_argument,
        _describe,
    ),
    "drain": (
        "Start nothing new; running jobs finish (--off: back to normal).",
        _drain_options,
        _drain,
    ),
    "prune": (
        "Delete finished jobs, with their events, logs and directories (admins).\n\nThe daemon "
        "also does it by itself, --keep-finished (default two weeks) after a job ends.",
        _prune_options,
        _prune,
    ),
}


def parser(name: str) -> argparse.ArgumentParser:
    """The parser of the job command `name`, its run function as `run`."""
    return plain.client_parser(_COMMANDS, name)
