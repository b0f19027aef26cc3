"""The CLI's shell: version, usage errors, one-line errors with exit codes."""

import subprocess
import sys

from gpupool import __version__


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
