"""The supervisor's pump at unit level: the out-of-memory line across reads, the log's cap."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.users import User, users

from gpupool.agent import supervisor
from gpupool.agent.jobdir import ExitStatus, JobDir
from gpupool.agent.supervisor import CHUNK, OOM_LINE, OOM_LINE_LONGEST, Log, MarkerScan

#: the interception library's line, as a process of pid 4242 writes it
OOM_MARKER = b"gpupool[4242]: out of memory on device "


@pytest.mark.parametrize("cut", range(1, len(OOM_MARKER)))
def test_the_marker_is_seen_when_it_straddles_two_reads(cut: int) -> None:
    scan = MarkerScan(OOM_LINE, OOM_LINE_LONGEST)
    line = b"x" * 100 + OOM_MARKER + b"0: 1 GiB used\n"
    at = 100 + cut
    scan.feed(line[:at])
    assert not scan.seen
    scan.feed(line[at:])
    assert scan.seen


def test_the_marker_is_seen_across_many_tiny_reads_and_never_made_up() -> None:
    scan = MarkerScan(OOM_LINE, OOM_LINE_LONGEST)
    for byte in b"gpupool[12]: out of mem" + b"\n" + OOM_MARKER:
        assert not scan.seen
        scan.feed(bytes([byte]))
    assert scan.seen
    near = MarkerScan(OOM_LINE, OOM_LINE_LONGEST)
    for chunk in (
        b"gpupool[1",
        b"]: out of",
        b" me",
        b"mory on device",
        b"gpupool: out of memory on device ",
    ):
        near.feed(chunk)
    assert not near.seen


def _log(path: Path, limit: int) -> Log:
    return Log(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), limit)


def test_a_log_under_its_cap_is_the_stream_itself(tmp_path: Path) -> None:
    log = _log(tmp_path / "out", 4096)
    for part in (b"a" * 1000, b"b" * 3000, b"c" * 96):
        log.write(part)
    assert (tmp_path / "out").read_bytes() == b"a" * 1000 + b"b" * 3000 + b"c" * 96


@pytest.mark.parametrize("part", [1, 100, 777, 3000, 5000, 3 * CHUNK])
def test_a_capped_log_keeps_the_newest_half_after_a_line_that_counts_the_dropped(
    tmp_path: Path, part: int
) -> None:
    limit = 8192
    log = _log(tmp_path / "out", limit)
    stream = bytes(i % 251 for i in range(200_000))
    for start in range(0, len(stream), part):
        log.write(stream[start : start + part])
        assert log.size == os.path.getsize(tmp_path / "out") <= limit
    data = (tmp_path / "out").read_bytes()
    head, _, tail = data.partition(b"]\n")
    assert head.startswith(b"[gpupool: ") and head.endswith(b" bytes dropped")
    dropped = int(head.split()[1])
    # what is left is the stream's newest bytes, and the count says how many came before
    assert tail == stream[dropped:] and len(tail) >= limit // 2 - part
    assert log.dropped == dropped


def test_no_cap_keeps_everything(tmp_path: Path) -> None:
    log = _log(tmp_path / "out", 0)
    for _ in range(64):
        log.write(b"z" * CHUNK)
    assert os.path.getsize(tmp_path / "out") == 64 * CHUNK


def test_the_pump_reads_in_chunks_and_records_the_exit_at_the_jobs_own_exit(
    tmp_path: Path,
) -> None:
    """The job exits while a child it left holds stderr: the exit is recorded then, with what
    the job wrote; the pump goes on until the child closes the pipe."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job: writes, leaves a child holding stderr, exits 3
        os.close(out_read)
        os.close(err_read)
        if os.fork() == 0:
            os.close(out_write)
            time.sleep(1)
            os.write(err_write, b"last\n")
            os._exit(0)
        os.write(out_write, b"o" * (3 * CHUNK))
        os.write(err_write, b"x" * 10 + OOM_MARKER[:5])
        os.write(err_write, OOM_MARKER[5:] + b"\n")
        os._exit(3)
    os.close(out_write)
    os.close(err_write)
    logs = [_log(tmp_path / name, 0) for name in ("stdout", "stderr")]
    scan = MarkerScan(OOM_LINE, OOM_LINE_LONGEST)
    ends: list[tuple[int, bool, bytes]] = []

    def ended(code: int) -> None:
        ends.append((code, scan.seen, (tmp_path / "stderr").read_bytes()))

    streams = [supervisor.Stream(out_read, logs[0]), supervisor.Stream(err_read, logs[1], scan)]
    supervisor.pump(pid, streams, ended)
    [(code, oom, stderr_then)] = ends
    assert code == 3 and oom
    assert b"x" * 10 + OOM_MARKER + b"\n" in stderr_then and b"last" not in stderr_then
    assert (tmp_path / "stdout").read_bytes() == b"o" * (3 * CHUNK)
    assert (tmp_path / "stderr").read_bytes().endswith(b"last\n")


def _supervise(jobdir: JobDir, argv: list[str], user: User) -> ExitStatus:
    """Run the real supervisor on `jobdir` for `argv` as `user`; the job's exit status."""
    jobdir.write_launch(
        {
            "argv": argv,
            "env": {"PATH": os.environ["PATH"]},
            "cwd": "/",
            "max_log_size": jobdir.max_log_size,
            "uid": user.uid,
            "gid": user.gid,
            "groups": [user.gid],
        }
    )
    subprocess.run([sys.executable, "-S", "-E", supervisor.__file__, str(jobdir.path)], check=True)
    deadline = time.monotonic() + 60
    while jobdir.exit_status() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    ended = jobdir.exit_status()
    assert ended is not None
    return ended


def test_the_supervisor_caps_a_users_log_and_keeps_its_tail(tmp_path: Path) -> None:
    """The real supervisor (root) runs a job as a real user that prints 2 MiB of numbered lines
    under a 64 KiB cap: the log is the user's, at most the cap, the marker first, then the
    stream's newest lines."""
    with users(1) as (alice,):
        jobdir = JobDir(tmp_path / "1", max_log_size=64 * 1024)
        script = "import sys\nfor i in range(200_000): sys.stdout.write(f'line {i:09d}\\n')\n"
        ended = _supervise(jobdir, [sys.executable, "-c", script], alice)
        assert ended.exit_code == 0 and not ended.oom
        found = jobdir.stdout.stat()
        assert (found.st_uid, found.st_mode & 0o777) == (alice.uid, 0o600)
        assert found.st_size <= 64 * 1024
        data = jobdir.stdout.read_bytes()
        marker, _, tail = data.partition(b"\n")
        dropped = int(marker.split()[1])
        assert marker == f"[gpupool: {dropped} bytes dropped]".encode()
        assert dropped + len(tail) == 200_000 * 15  # every byte kept or counted
        assert tail.endswith(b"line 000199999\n") and len(tail) >= 16 * 1024
        assert jobdir.read_log("stdout", len(data) - 15, 100) == b"line 000199999\n"


def test_a_job_that_closes_its_stdout_early_is_still_pumped(tmp_path: Path) -> None:
    with users(1) as (alice,):
        jobdir = JobDir(tmp_path / "1")
        script = "echo first; exec >&-; sleep 0.5; echo still >&2; exit 4"
        ended = _supervise(jobdir, ["sh", "-c", script], alice)
        assert ended.exit_code == 4
        assert jobdir.stdout.read_bytes() == b"first\n"
        assert jobdir.stderr.read_bytes() == b"still\n"


def test_a_supervisor_whose_job_directory_is_removed_ends_with_its_job(tmp_path: Path) -> None:
    """The exit status a full disk refused is written again until it goes in; a directory that
    is gone (pruned, or removed by an admin) will never take it, and its supervisor must not
    outlive the job waiting for it."""
    with users(1) as (alice,):
        jobdir = JobDir(tmp_path / "1")
        jobdir.write_launch(
            {
                "argv": ["sleep", "1"],
                "env": {"PATH": os.environ["PATH"]},
                "cwd": "/",
                "max_log_size": jobdir.max_log_size,
                "uid": alice.uid,
                "gid": alice.gid,
                "groups": [alice.gid],
            }
        )
        command = [sys.executable, "-S", "-E", supervisor.__file__, str(jobdir.path)]
        subprocess.run(command, check=True)
        deadline = time.monotonic() + 30
        while (pids := jobdir.pids()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids is not None
        shutil.rmtree(jobdir.path)
        while _running(pids.supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(pids.supervisor), "the supervisor outlived its job and directory"


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended: its parent, here init, reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
