"""`gpupool suspend`, `resume` and `resize`: a running shim job's memory moved to host memory and
back, or its share changed while it runs (the daemon's /v1/jobs/N/suspend, /resume, /resize)."""

from __future__ import annotations

import argparse

from gpupool.api.client import Client
from gpupool.cli import options, plain
from gpupool.core.errors import InvalidRequest


def _post(args: argparse.Namespace, what: str, body: dict[str, object]) -> dict[str, object]:
    with Client(args.url) as client:
        return dict(client.call("POST", f"/v1/jobs/{args.job}/{what}", json=body))


def _suspend(args: argparse.Namespace) -> int:
    answer = _post(args, "suspend", {})
    plain.answer(
        args,
        answer,
        f"job {args.job}: suspending (its memory goes to host memory; gpupool resume "
        f"{args.job} brings it back)",
    )
    return 0


def _resume(args: argparse.Namespace) -> int:
    answer = _post(args, "resume", {})
    plain.answer(
        args,
        answer,
        f"job {args.job}: resumes when its GPUs have room (gpupool describe {args.job} "
        "says why it waits)",
    )
    return 0


def _resize(args: argparse.Namespace) -> int:
    if args.memory is None and args.compute is None:
        raise InvalidRequest("nothing to resize: give --memory, --compute or both")
    answer = _post(args, "resize", plain.share_into(args, {}))
    plain.answer(args, answer, f"job {args.job}: {answer['changed']}")
    return 0


def _resize_options(parser: argparse.ArgumentParser) -> None:
    plain.job_argument(parser)
    options.add(parser, options.MEMORY)
    options.add(parser, options.COMPUTE)


_COMMANDS: plain.Commands = {
    "suspend": (
        "Suspend a running shim job: its memory to host memory, its GPU memory freed.\n\nIts "
        "launches stop at a safe point (its streams synchronised); `gpupool resume` brings its "
        "memory back at the same addresses.",
        plain.job_argument,
        _suspend,
    ),
    "resume": (
        "Resume a suspended job, at the same device addresses, once its GPUs have room.",
        plain.job_argument,
        _resume,
    ),
    "resize": (
        "Change a running shim job's memory or compute share; the library applies it within "
        "a second.\n\nGrowing must fit beside the other jobs on its GPUs; shrinking below what "
        "the job holds is refused. MPS and MIG shares cannot change while they run.",
        _resize_options,
        _resize,
    ),
}


def parser(name: str) -> argparse.ArgumentParser:
    """The parser of the elastic-memory command `name`, its run function as `run`."""
    return plain.client_parser(_COMMANDS, name)
