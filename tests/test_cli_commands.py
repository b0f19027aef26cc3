"""The lazy CLI: COMMANDS matches what the command modules declare, `--help` lists every command,
and a command imports only what it needs."""

from __future__ import annotations

import importlib
import inspect
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool import __version__
from gpupool.cli.main import COMMANDS, declared, help_text

#: what no client command may import: the daemon's, the simulator's and the tables' libraries
HEAVY = ("numpy", "httpx", "rich", "fastapi", "uvicorn", "yaml", "matplotlib", "pynvml")
#: what `--help`, `--version`, `version` and the client commands may not import either
FRAMEWORK = ("typer", "pydantic")


def _first_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


def test_commands_name_each_declared_command_its_module_and_help() -> None:
    found: dict[str, tuple[str, str]] = {}
    typer_modules = {e.module for e in COMMANDS.values() if not e.argparse}
    for module in sorted(typer_modules):
        for name, command in declared(module).items():
            found[name] = (module, _first_paragraph(command.help or ""))
    for name, entry in COMMANDS.items():
        if entry.argparse:
            parser = importlib.import_module(f"gpupool.cli.{entry.module}").parser(name)
            found[name] = (entry.module, parser.description or "")
    assert {name: (e.module, e.help) for name, e in COMMANDS.items()} == found


def _imports(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """`gpupool ARGS` in a fresh interpreter, and the top-level packages it imported."""
    script = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})),"
        " file=sys.stderr))\n"
        "from gpupool.cli.main import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=False
    )
    return done, set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [["--help"], [], ["--version"], ["version"]])
def test_help_and_version_import_no_framework(args: list[str]) -> None:
    done, imported = _imports(*args)
    assert done.returncode == (2 if not args else 0)  # no command: a usage error, as click's
    version = args in (["--version"], ["version"])
    assert done.stdout == (f"gpupool {__version__}" if version else help_text()) + "\n"
    assert imported.isdisjoint(HEAVY + FRAMEWORK), imported & set(HEAVY + FRAMEWORK)


def test_help_lists_every_command_with_its_line() -> None:
    done, _ = _imports("--help")
    listed = done.stdout.split("Commands:\n")[1]
    for name, entry in COMMANDS.items():
        assert f"\n  {name} " in "\n" + listed
        assert entry.help.split()[-1] in listed


@pytest.mark.parametrize(
    "args",
    [["ps"], ["describe", "1"], ["submit", "--compute", "30", "--", "true"], ["events"]],
)
def test_a_client_command_imports_none_of_the_heavy_libraries(args: list[str]) -> None:
    done, imported = _imports(args[0], "--url", "unix:///nonexistent/gpupool.sock", *args[1:])
    assert done.returncode == 7  # no daemon there: the client's one line
    assert imported.isdisjoint(HEAVY + FRAMEWORK), imported & set(HEAVY + FRAMEWORK)


def test_ctrl_c_in_a_client_command_is_one_line(tmp_path: Path) -> None:
    """`gpupool wait` on a daemon that never answers, interrupted: no traceback."""
    path = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)  # accepts the connection, never answers
    with listener:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "wait", "1", "--url", f"unix://{path}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(2)  # started and waiting for the answer
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert err == "gpupool: interrupted\n"


def test_gpus_imports_neither_the_frameworks_nor_rich(tmp_path: Path) -> None:
    node = str(tmp_path / "node")
    url = "unix:///nonexistent/gpupool.sock"
    done, imported = _imports("gpus", "--simulate", "1xA30", "--node-dir", node, "--url", url)
    assert done.returncode == 0, done.stderr
    # PyYAML stays: the simulated node reads its inventory with it
    unwanted = set(HEAVY + FRAMEWORK) - {"yaml"}
    assert imported.isdisjoint(unwanted), imported & unwanted
