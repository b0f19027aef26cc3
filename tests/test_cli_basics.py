"""The CLI's shell: version, usage errors, one-line errors with exit codes, a closed pipe."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.conftest import serving
from tests.agent.daemon_support import Daemon

from gpupool import __version__


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from serving(tmp_path, "1xA30")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool", *args], capture_output=True, text=True, check=False
    )


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"gpupool {__version__}"


def test_unknown_command_is_a_usage_error_without_traceback() -> None:
    result = run("no-such-command")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "No such command" in result.stderr


def _into_closed_pipe(*args: str, url: str = "") -> subprocess.CompletedProcess[str]:
    """`gpupool ARGS | head -0`: its output into a pipe whose reader is gone already."""
    read, write = os.pipe()
    os.close(read)
    env = dict(os.environ, GPUPOOL_URL=url) if url else None
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpupool", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=60,
        )
    finally:
        os.close(write)
    return subprocess.CompletedProcess(done.args, done.returncode, "", done.stderr)


@pytest.mark.parametrize("args", [("--help",), ("mig", "--help"), ("sim", "--help")])
def test_a_closed_pipe_ends_the_cli_quietly_with_141(args: tuple[str, ...]) -> None:
    done = _into_closed_pipe(*args)
    assert (done.returncode, done.stderr) == (141, "")


def test_ps_into_a_closed_pipe_ends_quietly_with_141(daemon: Daemon) -> None:
    for _ in range(3):
        daemon.submit(["sleep", "30"], memory="1Gi", compute=5)
    for args in (("ps",), ("ps", "--json"), ("describe", "1"), ("events",)):
        done = _into_closed_pipe(*args, url=daemon.url)
        assert (done.returncode, done.stderr) == (141, ""), args
    # an error is still an error, whatever became of the output
    missing = _into_closed_pipe("describe", "999", url=daemon.url)
    assert (missing.returncode, missing.stderr) == (2, "gpupool: error: no job 999\n")


@pytest.mark.parametrize("args", [("--help",), ("version",), ("mig", "--help"), ("sim", "--help")])
def test_output_to_a_full_disk_is_one_line_and_status_74(args: tuple[str, ...]) -> None:
    """`gpupool ARGS > /dev/full`: the write fails with ENOSPC, as on a full disk."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "gpupool", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 74  # EX_IOERR, not the internal error's 70
    assert done.stderr == "gpupool: error: cannot write the output: No space left on device\n"
