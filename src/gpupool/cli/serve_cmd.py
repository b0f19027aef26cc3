"""`gpupool serve`: the node daemon, in the foreground."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gpupool.cli import options
from gpupool.core import settings
from gpupool.core.errors import ConfigError, InvalidRequest
from gpupool.core.units import format_bytes, parse_bytes
from gpupool.scheduler.gpu_placement import GPU_POLICIES


def _token(token_file: Path | None, listen: str | None) -> str | None:
    if listen is None:
        return None
    if token_file is None:
        raise InvalidRequest("--listen needs --token-file: every TCP request needs a bearer token")
    try:
        token = token_file.read_text().strip()
    except OSError as err:
        raise ConfigError(f"cannot read the token file {token_file}: {err.strerror}") from err
    if not token:
        raise ConfigError(f"the token file {token_file} is empty")
    return token


def _context_reserve(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_bytes(text)
    except InvalidRequest as err:
        raise InvalidRequest(f"--context-reserve: {err}") from None


def register(app: typer.Typer) -> None:
    """Add `serve` to the app."""

    @app.command("serve")
    def serve(
        simulate: str | None = options.typer_option(options.SIMULATE),
        node_dir: Path | None = options.typer_option(options.NODE_DIR),
        state_dir: Path | None = typer.Option(
            None,
            "--state-dir",
            metavar="DIR",
            help="Jobs, logs and the socket (default /var/lib/gpupool as root, else "
            "$XDG_STATE_HOME/gpupool).",
        ),
        listen: str | None = typer.Option(
            None, "--listen", metavar="HOST:PORT", help="Also serve TCP (needs --token-file)."
        ),
        token_file: Path | None = typer.Option(
            None, "--token-file", metavar="FILE", help="The bearer token TCP clients must send."
        ),
        policy: str = typer.Option(
            settings.DAEMON.policy,
            "--policy",
            metavar="NAME",
            help="GPU choice: binpack, spread or gpupool.",
        ),
        cancel_grace: float = typer.Option(
            settings.DAEMON.cancel_grace_s,
            "--cancel-grace",
            metavar="SECONDS",
            help="SIGTERM to SIGKILL on cancel.",
        ),
        context_reserve: str | None = typer.Option(
            None,
            "--context-reserve",
            metavar="SIZE",
            help="Memory set aside per job and GPU for its CUDA context, beyond its share "
            "(default 512Mi on real GPUs, 0 on a simulated node).",
        ),
        watchdog: str | None = typer.Option(
            None,
            "--watchdog",
            metavar="report|kill",
            help="A GPU process of no job, or a job over its memory share: record it, or also "
            "SIGKILL it (default: $GPUPOOL_WATCHDOG, else report).",
        ),
        watchdog_exempt: str | None = typer.Option(
            None,
            "--watchdog-exempt",
            metavar="NAME,uid:N,...",
            help="GPU processes of no job to report as exempt and never kill: command names "
            "(as gpupool gpus shows them) and uid:N (default: $GPUPOOL_WATCHDOG_EXEMPT).",
        ),
        mig_keep_instances: bool = typer.Option(
            False,
            "--mig-keep-instances",
            envvar=settings.MIG_KEEP_INSTANCES.name,
            help="Leave the MIG instances made for jobs in place after them (default: destroy).",
        ),
    ) -> None:
        """Run the node daemon: a queue and admission for this server's GPUs."""
        # heavy imports here: client commands do not pay for FastAPI and uvicorn
        from gpupool.agent import statedir
        from gpupool.agent.agent import Agent, AgentConfig
        from gpupool.agent.exempt import NO_EXEMPTIONS, Exemptions
        from gpupool.agent.watchdog import Action
        from gpupool.api import server
        from gpupool.api.app import create_app
        from gpupool.devices.factory import open_backend

        if cancel_grace < 0:
            raise InvalidRequest(f"invalid --cancel-grace {cancel_grace:g}: must not be negative")
        if policy not in GPU_POLICIES:
            raise InvalidRequest(
                f"unknown policy {policy!r}; valid policies: {', '.join(GPU_POLICIES)}"
            )
        reserve = _context_reserve(context_reserve)
        action = Action.parse(
            watchdog or settings.WATCHDOG.read(os.environ) or AgentConfig.watchdog
        )
        exempt = watchdog_exempt or settings.WATCHDOG_EXEMPT.read(os.environ)
        exemptions = NO_EXEMPTIONS if exempt is None else Exemptions.parse(exempt)
        token = _token(token_file, listen)
        root = statedir.prepare(state_dir or statedir.default_state_dir())
        config = AgentConfig(
            root,
            policy=policy,
            cancel_grace_s=cancel_grace,
            context_reserve=reserve,
            watchdog=action,
            watchdog_exempt=exemptions,
            mig_keep_instances=mig_keep_instances,
        )
        lock = statedir.hold(root)
        sockets = [server.unix_socket(root / statedir.SOCKET_NAME)]
        if listen is not None:
            sockets.append(server.tcp_socket(listen))
        with open_backend(simulate, node_dir) as backend:
            agent = Agent(config, backend)
            if agent.launch_node.sim_node is not None:
                models = ", ".join(agent.launch_node.models)
                typer.echo(
                    f"gpupool serve: simulated node ({models}) at {agent.launch_node.sim_node}: "
                    "no real GPU is used",
                    err=True,
                )
            agent.start()
            where = [f"unix://{root / statedir.SOCKET_NAME}"] + (
                [f"http://{listen}"] if listen else []
            )
            typer.echo(
                f"gpupool serve: listening on {', '.join(where)} (policy {policy}, context "
                f"reserve {format_bytes(agent.context_reserve)} per job and GPU, watchdog "
                f"{action}, exempt {exemptions}, state {root})",
                err=True,
            )
            try:
                server.serve(create_app(agent, token), sockets)
            finally:
                agent.stop()
                (root / statedir.SOCKET_NAME).unlink(missing_ok=True)
                lock.close()
        typer.echo(
            "gpupool serve: stopped; running jobs go on and are adopted at the next start", err=True
        )
