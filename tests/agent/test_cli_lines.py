"""Each line the CLI prints is one write(2): commands run at once that append to one file never
split or join each other's lines, even with standard output unbuffered (PYTHONUNBUFFERED)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.agent.daemon_support import Daemon

#: `gpupool submit` run at once, as `for i in $(seq 25); do gpupool submit ... >> ids & done`
AT_ONCE = 25


def _env(daemon: Daemon) -> dict[str, str]:
    return dict(os.environ, GPUPOOL_URL=daemon.url, PYTHONUNBUFFERED="1")


def test_submits_appending_to_one_file_at_once_write_whole_lines(
    daemon: Daemon, tmp_path: Path
) -> None:
    ids = tmp_path / "ids"
    command = [sys.executable, "-m", "gpupool", "submit", "--compute", "1", "--", "true"]
    with ids.open("ab") as out:  # O_APPEND, shared by all of them as the shell's >> is
        running = [subprocess.Popen(command, stdout=out, env=_env(daemon)) for _ in range(AT_ONCE)]
        assert [p.wait(timeout=120) for p in running] == [0] * AT_ONCE
    text = ids.read_text()
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    assert all(line.isdigit() for line in lines), lines
    assert len(set(lines)) == len(lines) == AT_ONCE


def _writes(daemon: Daemon, *args: str) -> tuple[list[bytes], list[bytes]]:
    """What `gpupool ARGS` writes to stdout and stderr, write by write: each end is a
    SOCK_SEQPACKET socket, which keeps the bounds of each write(2) as one record."""
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(2)]
    (out, out_child), (err, err_child) = pairs
    with out, out_child, err, err_child:
        subprocess.run(
            [sys.executable, "-m", "gpupool", *args],
            stdout=out_child.fileno(),
            stderr=err_child.fileno(),
            env=_env(daemon),
            timeout=60,
            check=False,
        )
        out_child.close()
        err_child.close()
        return _records(out), _records(err)


def _records(sock: socket.socket) -> list[bytes]:
    records = []
    while record := sock.recv(1 << 16):
        records.append(record)
    return records


def test_each_line_is_one_write_on_stdout_and_stderr(daemon: Daemon) -> None:
    out, err = _writes(daemon, "submit", "--", "true")
    assert len(out) == 1 and out[0].rstrip(b"\n").isdigit() and out[0].endswith(b"\n"), out
    assert err == []
    out, err = _writes(daemon, "cancel", "999999")
    assert out == [] and len(err) == 1 and err[0].startswith(b"gpupool: error: "), err
    assert err[0].endswith(b"\n") and err[0].count(b"\n") == 1
