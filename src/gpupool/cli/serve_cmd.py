"""`gpupool serve`: the node daemon, in the foreground."""

from __future__ import annotations

import errno
import grp
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpupool.cli import options
from gpupool.core import settings
from gpupool.core.errors import ConfigError, DaemonError, InvalidRequest
from gpupool.core.units import format_bytes, parse_bytes, parse_duration
from gpupool.scheduler.names import POLICY_NAMES, check_policy

if TYPE_CHECKING:
    from gpupool.agent.agent import Agent
    from gpupool.slurm.node import SlurmNode

#: the socket group a root daemon uses when --socket-group is not given and the group exists
DEFAULT_SOCKET_GROUP = "gpupool"
#: a token is a line of text; anything larger is not a token file
MAX_TOKEN_FILE = 4096


def _token(token_file: Path | None, listen: str | None) -> str | None:
    if listen is None:
        return None
    if token_file is None:
        raise InvalidRequest("--listen needs --token-file: every TCP request needs a bearer token")
    # opened without following a link and checked on the open file: what is read is what was
    # checked, a regular file only the daemon's user can read
    try:
        fd = os.open(token_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        why = "it is a symbolic link" if err.errno == errno.ELOOP else err.strerror
        raise ConfigError(f"cannot read the token file {token_file}: {why}") from err
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise ConfigError(f"the token file {token_file} is not a regular file")
        if found.st_uid != os.geteuid():
            raise ConfigError(
                f"the token file {token_file} belongs to uid {found.st_uid}, not to the daemon's "
                f"user (uid {os.geteuid()}): chown it"
            )
        if found.st_mode & 0o077:
            raise ConfigError(
                f"the token file {token_file} is open to others (mode "
                f"{stat.S_IMODE(found.st_mode):04o}): chmod 600 {token_file}"
            )
        data = os.read(fd, MAX_TOKEN_FILE + 1)
    finally:
        os.close(fd)
    token = data.strip()
    if not token:
        raise ConfigError(f"the token file {token_file} is empty")
    if len(data) > MAX_TOKEN_FILE or not all(0x21 <= byte < 0x7F for byte in token):
        raise ConfigError(
            f"the token file {token_file} must hold one token of printable ASCII characters "
            f"(at most {MAX_TOKEN_FILE} bytes), e.g. from: openssl rand -hex 32"
        )
    return token.decode("ascii")


def _slurm_node(agent: Agent, shares: Path | None) -> SlurmNode | None:
    """The Slurm node's shares, held by this daemon's arbiter, with --slurm-shares."""
    from gpupool.slurm.node import SlurmNode

    if shares is None:
        return None
    node = SlurmNode(shares.resolve(), agent.arbiter, agent.launch_node.sim_node)
    # its jobs' GPU processes are no strangers to the watchdog: exempt, never killed
    agent.watchdog.exemptions = replace(agent.watchdog.exemptions, held=node.holder)
    return node


def _socket_gid(name: str | None) -> tuple[int | None, str]:
    """The socket group's gid: --socket-group's, else `gpupool`'s if it exists, else None (root
    only), with a line to print at start saying how to let users in. A daemon not run as root has
    none: it serves its own user only."""
    from gpupool.agent.access import group_id

    if os.geteuid() != 0:
        if name is not None:
            raise InvalidRequest(
                "--socket-group: a daemon not run as root serves its own user only; "
                "run it as root to share the node"
            )
        return None, ""
    if name is not None:
        return group_id(name, "--socket-group"), ""
    try:
        return grp.getgrnam(DEFAULT_SOCKET_GROUP).gr_gid, ""
    except KeyError:
        return None, (
            f"no group {DEFAULT_SOCKET_GROUP}: only root may use the socket; to "
            f"let users in: groupadd --system {DEFAULT_SOCKET_GROUP}; usermod -aG "
            f"{DEFAULT_SOCKET_GROUP} USER (then restart the daemon)"
        )


def _tls(cert: Path | None, key: Path | None, listen: str | None) -> tuple[Path, Path] | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InvalidRequest("--tls-cert and --tls-key go together")
    if listen is None:
        raise InvalidRequest("--tls-cert is for the TCP listener: add --listen HOST:PORT")
    return cert, key


def _size(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    try:
        return parse_bytes(text)
    except InvalidRequest as err:
        raise InvalidRequest(f"{option}: {err}") from None


def _duration(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except InvalidRequest as err:
        raise InvalidRequest(f"{option}: {err}") from None


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
            None,
            "--token-file",
            metavar="FILE",
            help="The bearer token TCP clients must send (a file of the daemon's user, mode 0600).",
        ),
        tls_cert: Path | None = typer.Option(
            None, "--tls-cert", metavar="FILE", help="Serve TCP over TLS: the PEM certificate."
        ),
        tls_key: Path | None = typer.Option(
            None, "--tls-key", metavar="FILE", help="Serve TCP over TLS: the PEM private key."
        ),
        allowed_hosts: list[str] = typer.Option(
            [],
            "--allowed-host",
            metavar="NAME",
            help="A name clients reach the daemon by, besides localhost and the --listen host "
            "(a request with another Host is refused); repeatable.",
        ),
        socket_group: str | None = typer.Option(
            None,
            "--socket-group",
            metavar="NAME",
            help="The group whose members may use the socket (default gpupool if it exists, "
            "else root only).",
        ),
        admin_group: str | None = typer.Option(
            None,
            "--admin-group",
            metavar="NAME",
            help="Members may drain the node and cancel any job (default: root and the "
            "daemon's user only).",
        ),
        policy: str = typer.Option(
            settings.DAEMON.policy,
            "--policy",
            metavar="NAME",
            help=f"Placement policy: {', '.join(POLICY_NAMES)}.",
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
        parked_memory: str | None = typer.Option(
            None,
            "--parked-memory",
            metavar="SIZE",
            help="Host memory services' parked replicas may hold together; past it the least "
            "recently used is stopped, to start cold at its next request (default: half the "
            "host's memory).",
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
            metavar="PATH,uid:N,...",
            help="GPU processes of no job to report as exempt and never kill: absolute paths of "
            "executables (as readlink /proc/PID/exe shows them; never command names, which any "
            "process sets for itself) and uid:N (default: $GPUPOOL_WATCHDOG_EXEMPT).",
        ),
        max_log_size: str | None = typer.Option(
            None,
            "--max-log-size",
            metavar="SIZE",
            help="Keep at most SIZE of each job's stdout and stderr (0: no limit; default "
            f"{format_bytes(settings.DAEMON.max_log_size)}): past it the oldest half is dropped "
            "and the log starts with a line saying how many bytes were.",
        ),
        keep_finished: str | None = typer.Option(
            None,
            "--keep-finished",
            metavar="DURATION",
            help="Delete finished jobs, their events, logs and directories this long after they "
            f"finished (e.g. 12h, 30m; default {settings.DAEMON.keep_finished_s / 86400:g}d; "
            "gpupool prune does it at once).",
        ),
        preempt: str = typer.Option(
            "none",
            "--preempt",
            metavar="HOW",
            help="What a high job that does not fit does to running low jobs: none (it waits) "
            "or suspend (their memory goes to host memory; they resume, in queue order, when "
            "room returns).",
        ),
        router: str | None = typer.Option(
            None,
            "--router",
            metavar="HOST:PORT",
            help="Also run the services' router: http://HOST:PORT/NAME/... goes to a ready "
            "replica of service NAME (docs/inference.md). It is a process of its own that "
            "outlives the daemon: a restarted daemon attaches to it again.",
        ),
        listener_limits: list[str] = typer.Option(
            [],
            "--listener-limit",
            metavar="NAME=VALUE",
            help="A bound on the clients' connections to the socket and --listen, e.g. "
            "max-connections-per-peer=32, idle-timeout=5s (names and defaults: "
            "docs/limits.md); repeatable.",
        ),
        mig_keep_instances: bool = typer.Option(
            False,
            "--mig-keep-instances",
            envvar=settings.MIG_KEEP_INSTANCES.name,
            help="Leave the MIG instances made for jobs in place after them (default: destroy).",
        ),
        slurm_shares: Path | None = typer.Option(
            None,
            "--slurm-shares",
            metavar="DIR",
            help="On a Slurm node: where its Prolog writes the jobs' shares (gpupool slurm "
            "prolog --shares), so that ps, /v1/slurm and the metrics show them (docs/slurm.md).",
        ),
        log_format: str = typer.Option(
            settings.LOG_FORMAT.default,
            "--log-format",
            envvar=settings.LOG_FORMAT.name,
            metavar="plain|json",
            help="The daemon's log on stderr: lines to read, or one JSON object per line (time, "
            "level, logger, message and the job, service and uid it is about) to ship to Loki "
            "or Elasticsearch.",
        ),
    ) -> None:
        """Run the node daemon: a queue and admission for this server's GPUs."""
        # heavy imports here: client commands do not pay for FastAPI and uvicorn
        from gpupool.agent import logs, statedir
        from gpupool.agent.access import Access
        from gpupool.agent.agent import Agent, AgentConfig
        from gpupool.agent.exempt import NO_EXEMPTIONS, Exemptions
        from gpupool.agent.watchdog import Action
        from gpupool.api import server
        from gpupool.api.app import create_app
        from gpupool.api.listener import parse_limits
        from gpupool.api.router_link import RouterLink
        from gpupool.devices.factory import open_backend
        from gpupool.isolation.daemon_paths import SOCKET_NAME, default_state_dir

        logs.configure(log_format)
        if cancel_grace < 0:
            raise InvalidRequest(f"invalid --cancel-grace {cancel_grace:g}: must not be negative")
        check_policy(policy)
        reserve = _size(context_reserve, "--context-reserve")
        log_cap = _size(max_log_size, "--max-log-size")
        parked = _size(parked_memory, "--parked-memory")
        keep_s = _duration(keep_finished, "--keep-finished")
        action = Action.parse(
            watchdog or settings.WATCHDOG.read(os.environ) or AgentConfig.watchdog
        )
        exempt = watchdog_exempt or settings.WATCHDOG_EXEMPT.read(os.environ)
        exemptions = NO_EXEMPTIONS if exempt is None else Exemptions.parse(exempt)
        limits = parse_limits(listener_limits, settings.LISTENER)
        token = _token(token_file, listen)
        tls_files = _tls(tls_cert, tls_key, listen)
        tls = server.tls_context(*tls_files) if tls_files is not None else None
        access = Access.of_this_process(admin_group)
        socket_gid, no_group = _socket_gid(socket_group)
        root = statedir.prepare(state_dir or default_state_dir())
        config = AgentConfig(
            root,
            policy=policy,
            cancel_grace_s=cancel_grace,
            context_reserve=reserve,
            watchdog=action,
            watchdog_exempt=exemptions,
            mig_keep_instances=mig_keep_instances,
            max_log_size=settings.DAEMON.max_log_size if log_cap is None else log_cap,
            keep_finished_s=settings.DAEMON.keep_finished_s if keep_s is None else keep_s,
            access=access,
            preempt=preempt,
            parked_memory=parked,
        )
        lock = statedir.hold(root)
        statedir.share(root, socket_gid)
        socket_path = root / SOCKET_NAME
        sockets = [server.unix_socket(socket_path, socket_gid)]
        watched = {root: server.identity(root), socket_path: server.identity(socket_path)}
        if listen is not None:
            sockets.append(server.tcp_socket(listen))
        with open_backend(simulate, node_dir) as backend:
            agent = Agent(config, backend)
            if agent.launch_node.sim_node is not None:
                models = ", ".join(agent.launch_node.models)
                logs.log.info(
                    "simulated node (%s) at %s: no real GPU is used",
                    models,
                    agent.launch_node.sim_node,
                )
            agent.start()
            if no_group:
                logs.log.info(no_group)
            scheme = "https" if tls is not None else "http"
            where = [f"unix://{socket_path}"] + ([f"{scheme}://{listen}"] if listen else [])
            logs.log.info(
                f"listening on {', '.join(where)} (policy {policy}, context reserve "
                f"{format_bytes(agent.context_reserve)} per job and GPU, watchdog {action}, "
                f"exempt {exemptions}, state {root})"
            )
            hosts = [*allowed_hosts, *([listen.rpartition(":")[0]] if listen else [])]
            app = create_app(
                agent,
                token,
                allowed_hosts=hosts,
                secure_cookies=tls is not None,
                slurm=_slurm_node(agent, slurm_shares),
            )
            # the router is a process of its own, which outlives this one (router_link.py)
            link = RouterLink(agent.services, root, router)
            try:
                link.open()
                alive = {p: i for p, i in watched.items() if i}
                gone = server.serve(app, sockets, tls, alive, limits)
            finally:
                link.close()
                agent.stop()
                server.remove_socket(socket_path, watched[socket_path])
                lock.close()
        if gone is not None:
            raise DaemonError(gone)
        logs.log.info("stopped; running jobs go on and are adopted at the next start")
