"""The interception library's dlsym hook keeps dlsym's own rules for everything it does not wrap."""

from __future__ import annotations

import subprocess
from pathlib import Path

from shim_support import PROGS, compile_prog, make_node, shim_env


def test_rtld_next_stays_relative_to_the_caller(tmp_path: Path) -> None:
    interposer = compile_prog(
        PROGS / "shim_interposer.c", tmp_path / "libinterposer.so", "-shared", "-fPIC"
    )
    env = shim_env(make_node(tmp_path / "node"))
    env["LD_PRELOAD"] = f"{env['LD_PRELOAD']}:{interposer}"
    env["HOME"] = "/somewhere"
    proc = subprocess.run(
        ["sh", "-c", 'echo "$HOME"'], env=env, capture_output=True, text=True, timeout=30
    )
    assert (proc.returncode, proc.stdout) == (0, "/somewhere\n")


def test_the_c_library_dlsym_is_what_answers_other_names(tmp_path: Path) -> None:
    script = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        "print(libc.strlen(b'gpupool'))\n"
        "print(hasattr(libc, 'no_such_function_anywhere'))\n"
    )
    env = shim_env(make_node(tmp_path / "node"))
    proc = subprocess.run(
        ["python3", "-c", script], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.stdout.split() == ["7", "False"]
