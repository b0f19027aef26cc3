"""The `gpupool` command: its command modules are imported only when their command is called.

Each command module declares its commands, with typer (`register(app)`) or, for the daemon's
client commands and `gpus`, with argparse (`parser(name)`, cli/plain.py says why); this module
knows only their names and one-line help (COMMANDS), so `gpupool ps` imports argparse, the light
API client and jobs_cmd, not typer, numpy, rich or the simulator, and `gpupool --help` imports
no command module at all. tests/test_cli_commands.py keeps COMMANDS equal to what the modules
declare.

`gpupool`, `gpupool --help`, `--version` and `version` are answered before typer is imported:
typer builds a pydantic validator for each parameter it parses, and importing pydantic alone
takes longer than these answers may (docs/benchmarks/cli.md).
"""

from __future__ import annotations

import errno
import importlib
import os
import select
import sys
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from gpupool import __version__
from gpupool.cli.lines import say
from gpupool.core import settings
from gpupool.core.errors import GpupoolError

if TYPE_CHECKING:
    import typer


class Entry(NamedTuple):
    """Where a command is declared, its line in `gpupool --help`, and whether it parses with
    argparse (the daemon's client commands: cli/plain.py) rather than typer."""

    module: str
    help: str
    argparse: bool = False


COMMANDS: dict[str, Entry] = {
    "version": Entry("version_cmd", "Print the gpupool version."),
    "gpus": Entry(
        "gpus_cmd",
        "Show the GPUs, MIG instances, processes and compute shares' use (NVML, or simulated).",
        argparse=True,
    ),
    "exec": Entry(
        "exec_cmd",
        "Run one command under a GPU share: gpupool exec --memory 4GiB -- python train.py",
    ),
    "sim": Entry(
        "sim_cmd",
        "Replay a workload of the Alibaba GPU trace through placement policies (FGD paper).",
    ),
    "demo": Entry(
        "sim_cmd",
        "Compare random, bestfit, fgd and gpupool on the trace (or a synthetic cluster).",
    ),
    "serve": Entry(
        "serve_cmd", "Run the node daemon: a queue and admission for this server's GPUs."
    ),
    "submit": Entry(
        "jobs_cmd", "Queue a command on the node's GPUs; prints the job id.", argparse=True
    ),
    "ps": Entry(
        "jobs_cmd",
        "List the daemon's jobs (queued and running; --all for finished ones too).",
        argparse=True,
    ),
    "logs": Entry(
        "jobs_cmd", "Print a job's output (stdout here, stderr on stderr).", argparse=True
    ),
    "cancel": Entry(
        "jobs_cmd",
        "Cancel jobs: SIGTERM to each job's process group, SIGKILL after a grace period.",
        argparse=True,
    ),
    "wait": Entry(
        "jobs_cmd",
        "Wait for jobs to end; exits with the first non-zero exit code, else 0.",
        argparse=True,
    ),
    "describe": Entry(
        "jobs_cmd",
        "A job's share, placement, events and, while queued, why it waits.",
        argparse=True,
    ),
    "suspend": Entry(
        "elastic_cmd",
        "Suspend a running shim job: its memory to host memory, its GPU memory freed.",
        argparse=True,
    ),
    "resume": Entry(
        "elastic_cmd",
        "Resume a suspended job, at the same device addresses, once its GPUs have room.",
        argparse=True,
    ),
    "resize": Entry(
        "elastic_cmd",
        "Change a running shim job's memory or compute share; the library applies it within "
        "a second.",
        argparse=True,
    ),
    "drain": Entry(
        "jobs_cmd", "Start nothing new; running jobs finish (--off: back to normal).", argparse=True
    ),
    "prune": Entry(
        "jobs_cmd",
        "Delete finished jobs, with their events, logs and directories (admins).",
        argparse=True,
    ),
    "service": Entry(
        "service_cmd",
        "Model services: replicas kept up, routed by `gpupool serve --router`, scaled with "
        "their traffic.",
        argparse=True,
    ),
    "events": Entry(
        "events_cmd",
        "The watchdog's events: GPU processes of no job, jobs over their memory share, kills.",
        argparse=True,
    ),
    "top": Entry(
        "top_cmd", "Watch the daemon's GPUs and jobs live (fits 80x24); q or Ctrl-C quits."
    ),
    "mig": Entry(
        "mig_cmd",
        "MIG layouts: show them, check them against a model, plan and apply mig-parted configs.",
    ),
    "k8s": Entry("k8s_cmd", "Kubernetes: device plugin, scheduler extender, webhook."),
    "slurm": Entry(
        "slurm_cmd", "Slurm: a node's Prolog and Epilog, and a dev cluster.", argparse=True
    ),
}


SUMMARY = "Share and pool NVIDIA GPUs."
#: the width `--help` wraps at, as typer's plain help does
HELP_WIDTH = 80


def version_line() -> str:
    return f"gpupool {__version__}"


def help_text() -> str:
    """`gpupool --help` without typer: the usage, the options and every command's line."""
    lines = ["Usage: gpupool [OPTIONS] COMMAND [ARGS]...", "", f"  {SUMMARY}", "", "Options:"]
    lines += [
        "  --version  Print the version and exit.",
        "  --help     Show this message and exit.",
    ]
    lines += ["", "Commands:"]
    import textwrap  # here: every other command would pay for its import

    width = max(len(name) for name in COMMANDS) + 2
    for name, entry in COMMANDS.items():
        wrapped = textwrap.wrap(entry.help, HELP_WIDTH - width - 2) or [""]
        lines.append(f"  {name.ljust(width)}{wrapped[0]}")
        lines += [" " * (width + 2) + more for more in wrapped[1:]]
    return "\n".join(lines)


def declared(module: str) -> dict[str, Any]:
    """The click commands that the command module `module` declares, by name."""
    import typer

    imported = importlib.import_module(f"gpupool.cli.{module}")
    # plain help everywhere: rich would cost more to import than most commands take to run
    holder = typer.Typer(rich_markup_mode=None)
    imported.register(holder)
    return dict(typer.main.get_group(holder).commands)


def build_app() -> typer.Typer:
    """The typer app, its commands to be imported when looked up."""
    import typer
    from typer.core import TyperGroup

    class LazyGroup(TyperGroup):
        """The root group of the typer commands in COMMANDS: a command's module is imported when
        that command is looked up."""

        def list_commands(self, ctx: Any) -> list[str]:
            return [name for name, entry in COMMANDS.items() if not entry.argparse]

        def get_command(self, ctx: Any, cmd_name: str) -> Any:
            if cmd_name not in self.commands and cmd_name in self.list_commands(ctx):
                self.commands.update(declared(COMMANDS[cmd_name].module))
            return self.commands.get(cmd_name)

    app = typer.Typer(
        name="gpupool",
        cls=LazyGroup,
        help=SUMMARY,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )

    def version(value: bool) -> None:
        if value:
            typer.echo(version_line())
            raise typer.Exit()

    @app.callback()
    def root(
        version: bool = typer.Option(
            False, "--version", callback=version, is_eager=True, help="Print the version and exit."
        ),
    ) -> None:
        """Share and pool NVIDIA GPUs."""

    return app


def _run_argparse(module: str, name: str, args: list[str]) -> int:
    """`gpupool NAME ARGS` for a command that parses with argparse; its exit status."""
    command = importlib.import_module(f"gpupool.cli.{module}").parser(name)
    parsed = command.parse_args(args)
    status: int = parsed.run(parsed)
    return status


#: click's exit status for a usage error, which `gpupool` without a command is
_USAGE_ERROR = 2
#: the shell's status for a command ended by Ctrl-C (128 + SIGINT)
_INTERRUPTED = 130
#: ... and for one ended by a closed pipe (128 + SIGPIPE), as `ls | head`'s ls
_PIPE_CLOSED = 141
#: sysexits' EX_IOERR: the output could not be written (a full disk, /dev/full)
_CANNOT_WRITE = 74
_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _answer_at_once(args: list[str]) -> tuple[str, int] | None:
    """What `gpupool ARGS` prints and its exit status when typer is not needed, else None."""
    if args in (["--version"], ["version"]):
        return version_line(), 0
    if args == ["--help"]:
        return help_text(), 0
    if not args:
        return help_text(), _USAGE_ERROR
    return None


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps gpupool errors to one line on stderr and an exit code.

    typer (standalone mode) and argparse print usage errors themselves and exit 2; anything else
    that escapes a command is turned into one line here, so no traceback reaches a user. Output
    whose reader went away (`gpupool ps | head -1`) ends the command quietly with 141; output
    that cannot be written (a full disk) is one line and 74.
    """
    try:
        _main(sys.argv[1:] if argv is None else list(argv))
    except SystemExit:
        _flush_output()
        raise


def _main(args: list[str]) -> None:
    at_once = _answer_at_once(args)
    entry = COMMANDS.get(args[0]) if args else None
    try:
        if at_once is not None:
            text, status = at_once
            say(text)
            sys.exit(status)
        if entry is not None and entry.argparse:
            sys.exit(_run_argparse(entry.module, args[0], args[1:]))
        build_app()(args=args, prog_name="gpupool")
    except GpupoolError as err:
        say(f"gpupool: error: {err}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:  # typer answers Ctrl-C itself; argparse commands land here
        say("gpupool: interrupted", err=True)
        sys.exit(_INTERRUPTED)
    except Exception as err:  # the last line of defence
        if isinstance(err, BrokenPipeError) and _reader_gone():
            sys.exit(_PIPE_CLOSED)
        if isinstance(err, OSError) and err.errno in _WRITE_ERRORS:
            _cannot_write(err)
        if settings.DEBUG.read(os.environ):
            raise
        say(
            f"gpupool: internal error: {type(err).__name__}: {err} "
            "(set GPUPOOL_DEBUG=1 for the traceback)",
            err=True,
        )
        sys.exit(70)


def _flush_output() -> None:
    """Writes what standard output still buffers before the exit. Its reader gone (what is
    buffered cannot be flushed, or click caught the closed pipe already: it then exits 1 with its
    quiet wrapper on stdout; by name, as typer has its own copy of click) ends quietly; a full
    disk ends with one line."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _end_quietly()
    except OSError as err:
        if err.errno in _WRITE_ERRORS:
            _cannot_write(err)
        return  # anything else: Python's exit says it as before
    except ValueError:  # a closed stream
        return
    if type(sys.stdout).__name__ == "PacifyFlushWrapper":
        _end_quietly()


def _cannot_write(err: OSError) -> NoReturn:
    what = err.filename or "the output"
    say(f"gpupool: error: cannot write {what}: {os.strerror(err.errno or errno.EIO)}", err=True)
    _drop_output()
    sys.exit(_CANNOT_WRITE)


def _reader_gone() -> bool:
    """Whether standard output is a pipe nobody reads any more (poll says POLLERR), and not,
    say, the daemon's socket that a BrokenPipeError came from."""
    try:
        poll = select.poll()
        poll.register(sys.__stdout__.fileno() if sys.__stdout__ else 1, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):
        return False


def _end_quietly() -> NoReturn:
    """End as `ls | head` ends: no message, status 141 (128 + SIGPIPE, what the shell reports
    for a command a closed pipe ended)."""
    _drop_output()
    sys.exit(_PIPE_CLOSED)


def _drop_output() -> None:
    """Standard output to /dev/null, so that Python's own flush at exit, of what could not be
    written, has nothing left to complain about."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
