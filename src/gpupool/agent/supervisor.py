"""The per-job supervisor: starts one job, pumps its output into its logs, writes its exit status.

Run as `python -S -E supervisor.py JOBDIR` by the daemon; it imports only the standard library
(no gpupool, no site packages), so each running job costs a few MiB for its supervisor. It
detaches (fork, new session), so neither the daemon's death nor a signal to the daemon's
process group reaches it, and the job's exit code is written even when no daemon is alive.

It runs as the daemon's user (root on a shared node), the job as its owner. JOBDIR is the
daemon's (0711, nobody else writes it): every file in it is opened relative to one descriptor of
it, never through a link (O_NOFOLLOW), and every new one exclusively (O_EXCL), 0600.

Files in JOBDIR (the daemon's side is `agent/jobdir.py`):
- `launch.json` (read): argv, env, cwd, uid, gid, groups, max_log_size;
- `claim` (created with O_EXCL before anything starts): one launch per job, even when a
  restarted daemon races a supervisor that is still starting;
- `stdout`, `stderr`: the job's output, 0600 and its owner's, written here from pipes (a pump:
  poll, fixed-size reads), so no line of the job's is ever held whole in memory, the log is
  capped at max_log_size (the tail kept, after a line saying how much was dropped), and the
  interception library's out-of-memory line is seen as it goes by;
- `pids.json`: supervisor pid and start time, job pid (= its process group) and start time;
- `exit.json`: the exit code (128 + n for signal n, as shells report it; 126/127 when the
  command cannot be executed or found), the end time, and `oom` when the library refused an
  allocation. Written when the job's own process exits: a child it left behind that still holds
  the pipes (a daemon it started) is pumped on until it closes them, but does not hold the end.
  On a full disk it is kept and written again every second until it goes in (ExitRecord).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import select
import signal
import sys
import time
import warnings  # noqa: F401  os.execvpe imports it lazily: after setuid it may be unreadable
from collections.abc import Callable

_NOT_EXECUTABLE = 126
_NOT_FOUND = 127
#: the line the interception library writes on stderr when it refuses an allocation past the
#: share, `gpupool[PID]: out of memory on device N: ...`
OOM_LINE = re.compile(rb"gpupool\[\d{1,10}\]: out of memory on device ")
#: the longest text OOM_LINE matches (a pid of ten digits)
OOM_LINE_LONGEST = len(b"gpupool[]: out of memory on device ") + 10
DEFAULT_MAX_LOG_SIZE = 1 << 30
#: one read from a job's pipe (the most of its output this process holds at once)
CHUNK = 64 * 1024
#: at the job's exit, how much more is read from a pipe that something still holds open (a
#: child left running) before the exit is recorded: what the job wrote before it exited
DRAIN_LIMIT = 1 << 20
FILE_MODE = 0o600
_NEW = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: how often the exit status that a full disk refused is tried again
RETRY_S = 1.0


class MarkerScan:
    """Whether text matching `marker` (at most `longest` bytes) went by in a stream read in
    chunks: it may straddle two of them."""

    def __init__(self, marker: re.Pattern[bytes], longest: int) -> None:
        self.marker = marker
        self.longest = longest
        self.seen = False
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        if self.seen:
            return
        window = self._tail + chunk
        self.seen = self.marker.search(window) is not None
        # what may be the marker's start: its longest match less one byte, no more
        self._tail = window[max(0, len(window) - self.longest + 1) :]


class Log:
    """A log file written in order; past `limit` bytes (0: no limit) it keeps its newest half,
    after one line that says how many bytes of the stream were dropped so far. The copy is done
    in place, CHUNK by CHUNK, so the cap costs no memory."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = limit
        self.size = 0
        self.dropped = 0
        self._marker_size = 0

    def write(self, data: bytes) -> None:
        if self.limit and self.size + len(data) > self.limit:
            data = self._make_room(data)
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
            self.size += written

    def _make_room(self, data: bytes) -> bytes:
        """Drop the oldest bytes so that the file's newest half and `data` stay: what of
        `data` is still to be written."""
        keep = self.limit // 2
        size = os.fstat(self.fd).st_size  # the owner may have cut the file itself
        old = max(0, size - self._marker_size)
        kept_old = max(0, min(keep - len(data), old))
        kept_new = data[max(0, len(data) - keep) :]
        self.dropped += old - kept_old + len(data) - len(kept_new)
        marker = f"[gpupool: {self.dropped} bytes dropped]\n".encode()
        source, copied = size - kept_old, 0
        while copied < kept_old:  # forward: the copy's target is always before its source
            block = os.pread(self.fd, min(CHUNK, kept_old - copied), source + copied)
            if not block:
                break
            os.pwrite(self.fd, block, len(marker) + copied)
            copied += len(block)
        os.pwrite(self.fd, marker, 0)
        self.size = len(marker) + copied
        os.ftruncate(self.fd, self.size)
        os.lseek(self.fd, self.size, os.SEEK_SET)
        self._marker_size = len(marker)
        return kept_new


class Stream:
    """One of the job's output pipes, pumped into its log (and scanned, for stderr)."""

    def __init__(self, pipe: int, log: Log, scan: MarkerScan | None = None) -> None:
        self.pipe = pipe
        self.log = log
        self.scan = scan
        os.set_blocking(pipe, False)

    def pump(self) -> int | None:
        """Move what the pipe holds now (one CHUNK at most): how many bytes (0: none now), or
        None at its end (every writer closed it)."""
        try:
            data = os.read(self.pipe, CHUNK)
        except BlockingIOError:
            return 0
        if not data:
            return None
        if self.scan is not None:
            self.scan.feed(data)
        with contextlib.suppress(OSError):  # a full disk loses output, never the job
            self.log.write(data)
        return len(data)

    def drain(self, limit: int) -> bool:
        """Pump until the pipe is empty, at its end, or `limit` bytes later; False at its end."""
        moved = 0
        while moved < limit:
            got = self.pump()
            if got is None:
                return False
            if not got:
                break
            moved += got
        return True


def _write_atomic(jobdir: int, name: str, data: dict[str, object]) -> None:
    tmp = f"{name}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=jobdir)  # left by a supervisor killed while writing
    fd = os.open(tmp, os.O_WRONLY | _NEW, FILE_MODE, dir_fd=jobdir)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out)
        out.flush()
        os.fsync(out.fileno())
    os.rename(tmp, name, src_dir_fd=jobdir, dst_dir_fd=jobdir)


class ExitRecord:
    """The job's exit status, written to exit.json once known. A full disk (or quota) does not
    lose it: it is kept here and written again, at most every RETRY_S, until it goes in; the
    daemon meanwhile sees this process alive and waits for it (never "exit code unknown")."""

    def __init__(self, jobdir: int, scan: MarkerScan) -> None:
        self.jobdir = jobdir
        self.scan = scan
        self.pending: dict[str, object] | None = None
        self._tried_at = 0.0

    def ended(self, code: int) -> None:
        self.pending = {"exit_code": code, "at": time.time(), "oom": self.scan.seen}
        self.write()

    def write(self) -> bool:
        """Whether nothing is left to write (tried again only RETRY_S after the last try)."""
        if self.pending is None:
            return True
        if time.monotonic() - self._tried_at < RETRY_S:
            return False
        self._tried_at = time.monotonic()
        try:
            _write_atomic(self.jobdir, "exit.json", self.pending)
        except OSError as err:
            # a full disk or quota passes: kept for the next try. Anything else (the job's
            # directory removed, by a prune or an admin) will not: nobody is left to read it
            if err.errno in (errno.ENOSPC, errno.EDQUOT) and os.fstat(self.jobdir).st_nlink:
                return False
        self.pending = None
        return True

    def until_written(self) -> None:
        while not self.write():
            time.sleep(RETRY_S)


def _new_log(jobdir: int, name: str, uid: int, gid: int) -> int:
    """The job's log `name`, new, 0600, its owner's: made by this process in the daemon's
    directory and handed over by descriptor, so no path the job's user controls is opened."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=jobdir)
    fd = os.open(name, os.O_RDWR | _NEW, FILE_MODE, dir_fd=jobdir)
    if os.getuid() == 0 and uid != 0:
        os.fchown(fd, uid, gid)
    return fd


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    return int(text[text.rindex(")") + 2 :].split()[19])


def _child(launch: dict[str, object], out: int, err: int, report: int) -> None:
    """In the forked child: become the job (own process group, its user, its pipes), exec."""
    try:
        os.setpgid(0, 0)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        uid, gid = int(str(launch["uid"])), int(str(launch["gid"]))
        if os.getuid() == 0 and uid != 0:
            groups = launch.get("groups")
            os.setgroups([int(g) for g in groups] if isinstance(groups, list) else [gid])
            os.setgid(gid)
            os.setuid(uid)
        os.chdir(str(launch["cwd"]))
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        argv = [str(a) for a in launch["argv"]]  # type: ignore[attr-defined]
        env = {str(k): str(v) for k, v in launch["env"].items()}  # type: ignore[attr-defined]
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(report, f"{exc.errno}:{exc.strerror}: {exc.filename or ''}".encode())
    except BaseException as exc:  # anything else: still one line, never a traceback
        os.write(report, f"0:{type(exc).__name__}: {exc}".encode())
    os._exit(_NOT_FOUND)


def _spawn(launch: dict[str, object], out: int, err: int) -> tuple[int, int | None, str]:
    """(pid, exit code if the exec failed, the failure's message)."""
    read, write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(launch, out, err, write)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        failure = pipe.read().decode(errors="replace")
    if not failure:
        return pid, None, ""
    os.waitpid(pid, 0)
    number, _, message = failure.partition(":")
    code = _NOT_FOUND if int(number or 0) in (errno.ENOENT, 0) else _NOT_EXECUTABLE
    return pid, code, message


def _status(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def pump(
    pid: int,
    streams: list[Stream],
    ended: Callable[[int], None],
    written: Callable[[], bool] = lambda: True,
) -> None:
    """Pump `streams` until the job `pid` has exited and every writer closed its pipe; at the
    job's exit (what it wrote before it drained), call `ended(exit code)` once. While
    `written()` says the exit status is not written yet, it is asked again every RETRY_S."""
    poller = select.poll()
    pidfd = os.pidfd_open(pid)
    poller.register(pidfd, select.POLLIN)
    live = {stream.pipe: stream for stream in streams}
    for pipe in live:
        poller.register(pipe, select.POLLIN)
    running = True
    while running or live:
        for fd, _ in poller.poll(None if written() else RETRY_S * 1000):
            if fd == pidfd:
                _, status = os.waitpid(pid, 0)
                running = False
                poller.unregister(pidfd)
                os.close(pidfd)
                for stream in [s for s in live.values() if not s.drain(DRAIN_LIMIT)]:
                    _close(stream, live, poller)
                ended(_status(status))
            elif fd in live and live[fd].pump() is None:
                _close(live[fd], live, poller)


def _close(stream: Stream, live: dict[int, Stream], poller: select.poll) -> None:
    poller.unregister(stream.pipe)
    del live[stream.pipe]
    os.close(stream.pipe)


def supervise(jobdir: str) -> int:
    """Claim the job, start it, record pids, pump its output, record the exit status."""
    here = os.open(jobdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        claim = os.open("claim", os.O_WRONLY | _NEW, FILE_MODE, dir_fd=here)
    except FileExistsError:
        return 0  # someone else launches (or launched) this job
    os.write(claim, str(os.getpid()).encode())
    os.close(claim)
    source = os.open("launch.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here)
    with os.fdopen(source) as text:
        launch = json.load(text)
    # the job's signals are its own; this process only has to outlive it
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    uid, gid = int(launch["uid"]), int(launch["gid"])
    limit = int(launch.get("max_log_size", DEFAULT_MAX_LOG_SIZE))
    logs = [Log(_new_log(here, name, uid, gid), limit) for name in ("stdout", "stderr")]
    (out_read, out_write), (err_read, err_write) = os.pipe2(os.O_CLOEXEC), os.pipe2(os.O_CLOEXEC)
    pid, failed, message = _spawn(launch, out_write, err_write)
    os.close(out_write)
    os.close(err_write)
    me = os.getpid()
    job_start = 0 if failed is not None else _start_time(pid)
    _write_atomic(
        here,
        "pids.json",
        {"supervisor": me, "supervisor_start": _start_time(me), "job": pid, "job_start": job_start},
    )
    scan = MarkerScan(OOM_LINE, OOM_LINE_LONGEST)
    record = ExitRecord(here, scan)
    if failed is not None:
        os.close(out_read)
        os.close(err_read)
        with contextlib.suppress(OSError):  # a full disk: the exit status still gets written
            logs[1].write(f"gpupool: cannot run {launch['argv'][0]}: {message}\n".encode())
        record.ended(failed)
    else:
        streams = [Stream(out_read, logs[0]), Stream(err_read, logs[1], scan)]
        pump(pid, streams, record.ended, record.write)
    record.until_written()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: supervisor.py JOBDIR\n")
        return 2
    if os.fork() != 0:
        return 0  # the daemon reaps this parent at once; the supervisor lives on detached
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    return supervise(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
