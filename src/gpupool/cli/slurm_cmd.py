"""`gpupool slurm ...`: the Prolog and Epilog of a Slurm node, and a dev cluster on this machine."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import typer

from gpupool.cli import options
from gpupool.cli.lines import say
from gpupool.core.errors import ConfigError, InvalidRequest

slurm_app = typer.Typer(help="Slurm: a node's Prolog and Epilog, and a dev cluster.")
cluster_app = typer.Typer(help="A Slurm cluster on this machine wired to gpupool, for tests.")
slurm_app.add_typer(cluster_app, name="dev-cluster")

SHARES = typer.Option(
    Path("/var/lib/gpupool/slurm"), "--shares", help="Where the jobs' share files go."
)
STATE = typer.Option(
    Path("/var/lib/gpupool"), "--state-dir", help="The node daemon's state directory."
)
SHARDS = typer.Option(10, "--shards", help="Shards per GPU, as gres.conf counts them.", min=1)


def _job() -> tuple[int, str]:
    """The Slurm job id and node this hook runs for (slurmd sets them, not the user)."""
    try:
        return int(os.environ["SLURM_JOB_ID"]), os.environ.get("SLURMD_NODENAME", "")
    except (KeyError, ValueError) as err:
        raise ConfigError("run by slurmd as its Prolog or Epilog: no SLURM_JOB_ID") from err


@slurm_app.command("prolog")
def prolog(
    shares: Path = SHARES,
    state_dir: Path = STATE,
    node_dir: Path | None = options.typer_option(options.NODE_DIR),
    shards: int = SHARDS,
) -> None:
    """The Prolog: make the job's share from what Slurm gave it on this node."""
    from gpupool.devices.factory import open_backend
    from gpupool.slurm import shares as slurm_shares

    job_id, node = _job()
    gres = slurm_shares.read_gres(job_id, node)
    if gres is None:
        return  # no GPU gres: the job runs as Slurm started it
    uid = int(os.environ.get("SLURM_JOB_UID", "-1"))
    entry = pwd.getpwuid(uid)
    gpus = slurm_shares.node_gpus(open_backend(None, node_dir))
    try:
        share = slurm_shares.share_of(job_id, entry.pw_name, uid, gres, gpus, shards)
    except InvalidRequest as err:
        # the job's tasks refuse to start with this line on their stderr (the SPANK plugin);
        # a failed Prolog would drain the node for the job's mistake
        slurm_shares.refuse(shares, job_id, str(err))
        say(f"job {job_id}: refused: {err}")
        return
    share = slurm_shares.write_share(shares, share, entry.pw_gid, gpus, state_dir, node_dir)
    say(f"job {job_id}: {share.shards or 'whole'} shard(s) of GPU(s) {list(share.gpus)}")


@slurm_app.command("epilog")
def epilog(
    shares: Path = SHARES,
    state_dir: Path = STATE,
    node_dir: Path | None = options.typer_option(options.NODE_DIR),
    shards: int = SHARDS,
) -> None:
    """The Epilog: end the job's share (however the job ended)."""
    from gpupool.slurm import shares as slurm_shares

    del shards  # the same flags as the Prolog's, so that one line serves both
    job_id, _ = _job()
    if slurm_shares.end_share(shares, job_id, state_dir, node_dir):
        say(f"job {job_id}: share ended")


@cluster_app.command("up")
def cluster_up(
    directory: Path = typer.Argument(..., help="Where the cluster's files go."),
    simulate: str = typer.Option(..., "--simulate", help=options.SIMULATE.help),
    shards: int = typer.Option(10, "--shards", help="Shards per GPU."),
    nodes: int = typer.Option(1, "--nodes", help="Slurm nodes (one per host here)."),
) -> None:
    """Start munged, slurmctld, slurmd and a gpupool daemon on simulated GPUs in DIRECTORY."""
    from gpupool.slurm import devcluster

    devcluster.up(directory, simulate, shards, nodes)
    say(f"dev cluster up: source {directory.resolve() / 'env'}")


@cluster_app.command("down")
def cluster_down(directory: Path = typer.Argument(..., help="The cluster's directory.")) -> None:
    """Cancel every job and stop the dev cluster in DIRECTORY."""
    from gpupool.slurm import devcluster

    stopped = devcluster.down(directory)
    say(f"dev cluster down: stopped {', '.join(stopped) or 'nothing'}")


def register(app: typer.Typer) -> None:
    """Add `slurm` to the app."""
    app.add_typer(slurm_app, name="slurm")
