"""`gpupool slurm ...`: the Prolog and Epilog of a Slurm node, and a dev cluster on this machine.

It parses with argparse, not typer (cli/plain.py says why): the Prolog runs before each job's
first task, so its start is part of every job's start.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpupool.cli import options
from gpupool.cli.lines import say
from gpupool.core.errors import ConfigError

HELP = "Slurm: a node's Prolog and Epilog, and a dev cluster."
#: how Slurm hands the SPANK plugin's options (--gpupool-NAME) to the Prolog
OPTION_ENV = "SPANK__SLURM_SPANK_OPTION_gpupool_gpupool_"


def _job() -> tuple[int, str]:
    """The Slurm job id and node this hook runs for (slurmd sets them, not the user)."""
    try:
        return int(os.environ["SLURM_JOB_ID"]), os.environ.get("SLURMD_NODENAME", "")
    except (KeyError, ValueError) as err:
        raise ConfigError("run by slurmd as its Prolog or Epilog: no SLURM_JOB_ID") from err


def _prolog(args: argparse.Namespace) -> int:
    from gpupool.api.client import Client
    from gpupool.slurm.gres import read_gres

    job_id, node = _job()
    gres = read_gres(job_id, node)
    if gres is None:
        return 0  # no GPU gres: the job runs as Slurm started it
    kind, count, gpus = gres
    body = {
        "job_id": job_id,
        "uid": int(os.environ.get("SLURM_JOB_UID", "-1")),
        "kind": kind,
        "count": count,
        "gpus": list(gpus),
        "shards_per_gpu": args.shards,
        **_asked(),
    }
    with Client(args.url) as client:
        answer = client.call("POST", "/v1/slurm/prolog", json=body)
    if "refused" in answer:
        # its tasks refuse to start with this line on their stderr (the SPANK plugin); a failed
        # Prolog would drain the node for the job's mistake
        say(f"job {job_id}: refused: {answer['refused']}")
    else:
        share = answer["share"]
        say(f"job {job_id}: {share['shards'] or 'whole'} shard(s) of GPU(s) {share['gpus']}")
    return 0


def _asked() -> dict[str, object]:
    """The job's --gpupool-* options (the plugin checked their form at submit)."""
    asked: dict[str, object] = {}
    for name in ("priority", "policy", "memory", "compute"):
        value = os.environ.get(OPTION_ENV + name)
        if value:
            asked[name] = value
    return asked


def _epilog(args: argparse.Namespace) -> int:
    from gpupool.api.client import Client

    job_id, _ = _job()
    with Client(args.url) as client:
        if client.call("POST", "/v1/slurm/epilog", json={"job_id": job_id})["ended"]:
            say(f"job {job_id}: share ended")
    return 0


def _up(args: argparse.Namespace) -> int:
    from gpupool.slurm import devcluster

    devcluster.up(args.directory, args.simulate, args.shards, args.nodes)
    say(f"dev cluster up: source {args.directory.resolve() / 'env'}")
    return 0


def _down(args: argparse.Namespace) -> int:
    from gpupool.slurm import devcluster

    stopped = devcluster.down(args.directory)
    say(f"dev cluster down: stopped {', '.join(stopped) or 'nothing'}")
    return 0


def _hook_options(command: argparse.ArgumentParser) -> None:
    options.add(command, options.URL)
    command.add_argument(
        "--shards", type=int, default=10, metavar="M", help="Shards per GPU, as in gres.conf."
    )


def parser(name: str) -> argparse.ArgumentParser:
    """The parser of `gpupool slurm`, each subcommand's run function as `run`."""
    command = argparse.ArgumentParser(prog=f"gpupool {name}", description=HELP)
    command.set_defaults(run=lambda _args: 2)
    sub = command.add_subparsers(dest="action", metavar="COMMAND", required=True)
    prolog = sub.add_parser("prolog", help="The Prolog: make the job's share from its gres.")
    prolog.set_defaults(run=_prolog)
    epilog = sub.add_parser("epilog", help="The Epilog: end the job's share.")
    epilog.set_defaults(run=_epilog)
    for hook in (prolog, epilog):
        _hook_options(hook)
    cluster = sub.add_parser("dev-cluster", help="A Slurm cluster on this machine, for tests.")
    actions = cluster.add_subparsers(dest="cluster_action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="Start munged, slurmctld, slurmd and a gpupool daemon.")
    up.add_argument("directory", type=Path, metavar="DIR", help="Where the cluster's files go.")
    options.add(up, options.SIMULATE, required=True)
    up.add_argument("--shards", type=int, default=10, metavar="M", help="Shards per GPU.")
    up.add_argument("--nodes", type=int, default=1, metavar="N", help="Slurm nodes (1 here).")
    up.set_defaults(run=_up)
    down = actions.add_parser("down", help="Cancel every job and stop the dev cluster.")
    down.add_argument("directory", type=Path, metavar="DIR", help="The cluster's directory.")
    down.set_defaults(run=_down)
    return command
