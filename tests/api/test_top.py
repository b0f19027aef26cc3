"""`gpupool top` against a real daemon: one frame that fits 80x24, and the live view in a pty
that quits on q and on Ctrl-C."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from tests.agent.daemon_support import CUDA_JOB, Daemon, cli


def test_once_prints_one_frame_that_fits_80_by_24(daemon: Daemon) -> None:
    busy = [
        daemon.submit([sys.executable, CUDA_JOB, "60", "256"], memory="4Gi", compute=25, name=n)
        for n in ("alpha", "beta")
    ]
    for n in range(20):  # more jobs than rows: the frame says how many it leaves out
        daemon.submit(["sleep", "60"], gpus=2, compute=90, name=f"waiting-{n}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        shown = cli("top", "--once", url=daemon.url, check=True).stdout
        if "256M/4G" in shown:
            break
        time.sleep(0.3)
    lines = shown.splitlines()
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80, shown
    assert lines[0].startswith("gpupool top  2 GPUs  2 running  20 queued  simulated")
    assert lines[1].lstrip().startswith("0 A100-40GB") and "50%" in lines[1]
    header = lines.index(next(line for line in lines if line.startswith("ID  NAME")))
    rows = {line.split()[1]: line for line in lines[header + 1 : header + 3]}
    assert set(rows) == {"alpha", "beta"} and all("256M/4G" in rows[n] for n in rows), shown
    assert "more" in lines[-2] and lines[-1] == "q quit"
    for job in busy:
        daemon.call("POST", f"/v1/jobs/{job}/cancel", json={})


def _run_in_pty(daemon: Daemon) -> tuple[subprocess.Popen[bytes], int]:
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = dict(os.environ, GPUPOOL_URL=daemon.url, TERM="xterm-256color")
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "top", "--interval", "0.3"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(terminal)
    return process, controller


def _read_until(controller: int, marker: bytes, timeout: float = 20) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.2)
        if ready:
            try:
                seen += os.read(controller, 65536)
            except OSError:
                break
    return seen


@pytest.mark.parametrize("key", [b"q", b"\x03"], ids=["q", "ctrl-c"])
def test_the_live_view_quits_on_q_and_ctrl_c(daemon: Daemon, key: bytes) -> None:
    daemon.submit(["sleep", "60"], compute=10, name="watched")
    process, controller = _run_in_pty(daemon)
    try:
        seen = _read_until(controller, b"watched")
        assert b"watched" in seen and b"gpupool top" in seen, seen[-2000:]
        time.sleep(0.5)  # a refresh or two
        assert process.poll() is None  # still live
        os.write(controller, key)
        assert process.wait(timeout=10) == 0
        tail = _read_until(controller, b"\x00", timeout=1)
        assert b"Traceback" not in seen + tail
    finally:
        if process.poll() is None:
            process.kill()
        os.close(controller)


def test_bad_input_and_no_daemon_are_one_line() -> None:
    bad = cli("top", "--interval", "0", url="unix:///nonexistent/gpupool.sock")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--interval" in bad.stderr
    gone = cli("top", "--once", url="unix:///nonexistent/gpupool.sock")
    assert (
        gone.returncode == 7 and gone.stderr.count("\n") == 1 and "no gpupool daemon" in gone.stderr
    )


def test_the_live_view_outlives_a_daemon_restart(daemon: Daemon) -> None:
    daemon.submit(["sleep", "60"], compute=10, name="steady")
    process, controller = _run_in_pty(daemon)
    try:
        assert b"steady" in _read_until(controller, b"steady")
        daemon.kill()
        assert b"daemon not answering" in _read_until(controller, b"daemon not answering")
        assert process.poll() is None
        daemon.start()
        daemon.submit(["sleep", "60"], compute=10, name="after-restart")
        assert b"after-restart" in _read_until(controller, b"after-restart")
        os.write(controller, b"q")
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(controller)
