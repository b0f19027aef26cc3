"""The per-job supervisor: starts one job, waits for it, writes its exit status atomically.

Run as `python -S -E supervisor.py JOBDIR` by the daemon; it imports only the standard library
(no gpupool, no site packages), so each running job costs a few MiB for its supervisor. It
detaches (fork, new session), so neither the daemon's death nor a signal to the daemon's
process group reaches it, and the job's exit code is written even when no daemon is alive.

Files in JOBDIR (the daemon's side is `agent/jobdir.py`):
- `launch.json` (read): argv, env, cwd, uid, gid, groups, stdout and stderr paths;
- `claim` (created with O_EXCL before anything starts): one launch per job, even when a
  restarted daemon races a supervisor that is still starting;
- `pids.json`: supervisor pid and start time, job pid (= its process group) and start time;
- `exit.json`: the exit code (128 + n for signal n, as shells report it; 126/127 when the
  command cannot be executed or found), the end time.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
import warnings  # noqa: F401  os.execvpe imports it lazily: after setuid it may be unreadable

_NOT_EXECUTABLE = 126
_NOT_FOUND = 127


def _write_atomic(path: str, data: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        json.dump(data, out)
        out.flush()
        os.fsync(out.fileno())
    os.rename(tmp, path)


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    return int(text[text.rindex(")") + 2 :].split()[19])


def _child(launch: dict[str, object], report: int) -> None:
    """In the forked child: become the job (own process group, its user, its files), exec."""
    try:
        os.setpgid(0, 0)
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(str(launch["stdout"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        err = os.open(str(launch["stderr"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        uid, gid = int(str(launch["uid"])), int(str(launch["gid"]))
        if os.getuid() == 0 and uid != 0:
            os.fchown(out, uid, gid)
            os.fchown(err, uid, gid)
            groups = launch.get("groups")
            os.setgroups([int(g) for g in groups] if isinstance(groups, list) else [gid])
            os.setgid(gid)
            os.setuid(uid)
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
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


def _spawn(launch: dict[str, object]) -> tuple[int, int | None, str]:
    """(pid, exit code if the exec failed, the failure's message)."""
    read, write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(launch, write)
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


def supervise(jobdir: str) -> int:
    """Claim the job, start it, record pids, wait, record the exit status."""
    try:
        claim = os.open(os.path.join(jobdir, "claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return 0  # someone else launches (or launched) this job
    os.write(claim, str(os.getpid()).encode())
    os.close(claim)
    with open(os.path.join(jobdir, "launch.json")) as source:
        launch = json.load(source)
    # the job's signals are its own; this process only has to outlive it
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    pid, failed, message = _spawn(launch)
    me = os.getpid()
    if failed is not None:
        with open(str(launch["stderr"]), "a") as err:
            err.write(f"gpupool: cannot run {launch['argv'][0]}: {message}\n")
        code, job_start = failed, 0
    else:
        job_start = _start_time(pid)
    _write_atomic(
        os.path.join(jobdir, "pids.json"),
        {"supervisor": me, "supervisor_start": _start_time(me), "job": pid, "job_start": job_start},
    )
    if failed is None:
        _, status = os.waitpid(pid, 0)
        code = _status(status)
    _write_atomic(os.path.join(jobdir, "exit.json"), {"exit_code": code, "at": time.time()})
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
