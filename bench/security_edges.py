"""Issue 35's edge cases for bench/security.py (which runs them on its shared daemon, before
case 15 stops it), or alone on a daemon of their own:

    python bench/security_edges.py      # as root; about a minute; exit 1 if a case is not contained

An exemption claimed from a user namespace, ids and offsets past 64 bits, error bodies of the
framework, a missing store beside job directories, a closed pipe, an absurd memory burst, another
user's look at the node, a root daemon's default node, and a job that ends on a full disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from security_support import (  # noqa: E402
    SPEC,
    XORG,
    Bench,
    attempt,
    last_line,
    main_daemon,
    refused_line,
    said,
    serve_once,
    setup,
    table,
)
from tests.agent.conftest import _kill_jobs  # noqa: E402
from tests.agent.daemon_support import CUDA_JOB, Daemon, until  # noqa: E402
from tests.agent.test_daemon_recovery import socket_port  # noqa: E402
from tests.agent.watchdog_support import ESCAPE_MIB, wait_for_event  # noqa: E402
from tests.users import remove_tree, run_as, user_env, world_dir  # noqa: E402

from gpupool.agent.jobdir import alive  # noqa: E402
from gpupool.isolation.libraries import native_libraries  # noqa: E402

BIG = 2**63
#: carol's namespace: the exempted path made to hold the interpreter, over the host's /usr/lib
#: (an overlay of her own), or bind-mounted where the path exists
_IMPOSTOR = r"""
set -e
t=$1; xorg=$2; python=$3; shift 3
if [ -e "$xorg" ]; then mount --bind "$python" "$xorg"; else
  lower=$(dirname "$(dirname "$xorg")")
  mkdir -p "$t/upper/$(basename "$(dirname "$xorg")")" "$t/work"
  cp "$python" "$t/upper/$(basename "$(dirname "$xorg")")/$(basename "$xorg")"
  mount -t overlay overlay -o "lowerdir=$lower,upperdir=$t/upper,workdir=$t/work" "$lower"
fi
exec "$xorg" "$@"
"""


def case_namespace_exemption(b: Bench) -> None:
    c = "35.2 exemption from a namespace"
    scratch = world_dir()
    b.dirs.append(scratch)
    os.chown(scratch, b.carol.uid, b.carol.gid)
    env = user_env(b.carol, {"LD_LIBRARY_PATH": str(native_libraries().sim_dir)})
    env["GPUPOOL_SIM_NODE"] = str(b.daemon.node_dir)
    python = os.path.realpath(sys.executable)
    argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _IMPOSTOR, "sh"]
    impostor = subprocess.Popen(
        [*argv, str(scratch), XORG, python, CUDA_JOB, "60", str(ESCAPE_MIB)],
        user=b.carol.uid,
        group=b.carol.gid,
        extra_groups=[],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    b.processes.append(impostor)
    exe = until(lambda: _exe(impostor.pid), 10)
    event = wait_for_event(b.daemon, lambda e: e["pid"] == impostor.pid, timeout=20)
    try:
        code = impostor.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = None
    b.record(
        c,
        "carol (outside gpupool)",
        f"in a user and mount namespace of her own, the interpreter made {XORG} (an overlay "
        f"over its directory) runs a CUDA program; the daemon exempts {XORG} by path",
        f"/proc/PID/exe reads {exe!r}; event `{event['kind']}`: {event['detail']}; the process "
        f"ended by signal {-(code or 0)}",
        event["kind"] == "no_job" and code == -signal.SIGKILL,
    )


def _exe(pid: int) -> str:
    with contextlib.suppress(OSError):
        target = os.readlink(f"/proc/{pid}/exe")
        return target if target == XORG else ""
    return ""


def case_ids_past_64_bits(b: Bench) -> None:
    c = "35.8 ids past 64 bits"
    serve_log = b.root / "serve.log"
    logged = serve_log.stat().st_size
    for method, path, body in (
        ("GET", f"/v1/jobs/{BIG}", None),
        ("POST", f"/v1/jobs/{BIG}/cancel", "{}"),
        ("POST", f"/v1/jobs/{2**64}/resize", '{"memory": "1Gi"}'),
        ("GET", f"/jobs/{BIG}", None),
        ("GET", f"/v1/jobs/{b.job}/logs?offset={BIG}", None),
    ):
        answer = b.request(b.alice, method, path, body)
        b.record(
            c,
            "alice",
            f"`{method} {path}`",
            str(answer),
            400 <= answer.status < 500 and set(json.loads(answer.text)) == {"error", "message"},
        )
    with serve_log.open() as text:
        text.seek(logged)
        log = text.read()
    b.record(c, "root", "the daemon's log meanwhile", f"tracebacks: {log.count('Traceback')}",
             "Traceback" not in log)  # fmt: skip


def case_error_shapes(b: Bench) -> None:
    c = "35.s error bodies"
    json_type = {"Content-Type": "application/json"}
    deep = b'{"argv": ["true"], "env": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with b.local() as client:
        for what, answer in (
            ("`GET /v1/nothing-here`", client.get("/v1/nothing-here")),
            ("`GET /v1/drain` (a POST route)", client.get("/v1/drain")),
            ("`POST /v1/jobs`, a body not UTF-8",
             client.post("/v1/jobs", content=b'{"argv": ["\xff"]}', headers=json_type)),
            ("`POST /v1/jobs`, JSON nested 100,000 deep",
             client.post("/v1/jobs", content=deep, headers=json_type)),
        ):  # fmt: skip
            body = answer.json()
            b.record(
                c,
                "root",
                what,
                f"{answer.status_code} {json.dumps(body)}",
                answer.status_code < 500 and set(body) == {"error", "message"},
            )


def case_closed_pipe(b: Bench) -> None:
    c = "35.s closed pipe"
    script = f"{shlex.quote(sys.executable)} -m gpupool ps | true; echo $?"
    done = run_as(b.alice, ["bash", "-c", f"set -o pipefail; {script}"],
                  env={"GPUPOOL_URL": b.daemon.url})  # fmt: skip
    code = done.stdout.strip()
    b.record(
        c,
        "alice",
        "`gpupool ps | true` (the reader gone before ps writes)",
        f"exit {code}; stderr {done.stderr.strip()!r}",
        code == "141" and not done.stderr.strip(),
    )


def case_absurd_burst(b: Bench) -> None:
    c = "35.s memory burst"
    before = b.job_ids()
    done = b.gpupool(b.alice, "submit", "--priority", "low", "--memory", "1Gi",
                     "--memory-burst", "1000000Ti", "--", "true")  # fmt: skip
    stored = b.job_ids() != before
    b.record(
        c,
        "alice",
        "`gpupool submit --priority low --memory 1Gi --memory-burst 1000000Ti -- true`",
        f"{said(done)}; stored: {'yes' if stored else 'nothing'}",
        refused_line(done, 2) and not stored,
    )


def case_node_read_only(b: Bench) -> None:
    c = "35.s another's node"
    node = b.daemon.node_dir
    done = b.gpupool(b.bob, "gpus", "--node-dir", str(node))
    wrote = run_as(b.bob, ["sh", "-c", f"echo x >> {node / 'node.json'}"])
    b.record(
        c,
        "bob",
        "`gpupool gpus --node-dir NODE` on root's node, then `echo x >> NODE/node.json`",
        f"gpus exit {done.returncode} ({len(done.stdout.splitlines())} lines); the write: "
        f"{last_line(wrote.stderr) or 'written'}",
        done.returncode == 0 and wrote.returncode != 0,
    )


def case_default_node(b: Bench) -> None:
    c = "35.s default node"
    runtime, root = world_dir(), world_dir()
    b.dirs += [runtime, root]
    extra = ("--socket-group", b.group)
    daemon = Daemon(root, "1xA30", extra, {"XDG_RUNTIME_DIR": str(runtime)}, None, True)
    daemon.start()
    try:
        job = ["--memory", "1Gi", "--", "python3", CUDA_JOB, "0.2", "64"]
        done = run_as(b.alice, [sys.executable, "-m", "gpupool", "submit", "--wait", *job],
                      env={"GPUPOOL_URL": daemon.url})  # fmt: skip
        mode = (runtime / "gpupool-sim").stat().st_mode & 0o777
        b.record(
            c,
            "alice",
            "a CUDA job on a root daemon's default simulated node (no --node-dir)",
            f"exit {done.returncode}: {last_line(done.stderr) or done.stdout.strip()}; the "
            f"node's base {mode:04o}",
            done.returncode == 0 and mode == 0o711,
        )
    finally:
        daemon.stop()
        _kill_jobs(daemon)


def case_missing_store(b: Bench) -> None:
    c = "35.9 missing store"
    root = world_dir()
    b.dirs.append(root)
    daemon = Daemon(root, "1xA30").start()
    try:
        for number in range(3):
            daemon.wait(daemon.submit(["echo", f"job {number}"]))
    finally:
        daemon.stop()
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (daemon.state_dir / name).unlink(missing_ok=True)
    args = ("--node-dir", str(daemon.node_dir), "--state-dir", str(daemon.state_dir))
    code, err = serve_once(*args, wait=20)
    logs = len(list(daemon.state_dir.glob("jobs/*/stdout")))
    b.record(
        c,
        "root",
        "`gpupool serve` with state.db removed beside 3 job directories",
        f"exit {code}: {err.strip()}; job logs left: {logs} of 3",
        code == 2 and err.count("\n") == 1 and logs == 3,
    )


def case_full_disk(b: Bench) -> None:
    c = "35.s full disk"
    root = world_dir()
    b.dirs.append(root)
    (root / "state").mkdir(mode=0o700)
    options = "size=16m,mode=0700"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(root / "state")],
                   check=True)  # fmt: skip
    daemon = Daemon(root, "1xA30").start()
    try:
        job = daemon.submit(["sh", "-c", "sleep 2; exit 7"])
        pids = daemon.state_dir / "jobs" / str(job) / "pids.json"
        until(pids.exists)
        _fill(daemon.state_dir / "filler")
        time.sleep(5)
        held = json.loads(pids.read_text())
        during = daemon.job(job)["state"]
        kept = alive(held["supervisor"], held["supervisor_start"])
        (daemon.state_dir / "filler").unlink()
        ended = daemon.wait(job, timeout=30)
        b.record(
            c,
            "root",
            f"job {job} (`sleep 2; exit 7`) ends while its state dir (a 16 MiB tmpfs) is full; "
            "5 s later the filler is removed",
            f"while full: job {during}, its supervisor {'alive' if kept else 'GONE'}; after: "
            f"{ended['state']}, exit code {ended['exit_code']}",
            during == "running" and kept and ended["exit_code"] == 7,
        )
    finally:
        daemon.stop()
        _kill_jobs(daemon)
        subprocess.run(["umount", "-l", str(root / "state")], check=False)


def _fill(path: Path) -> None:
    """A file that takes every byte left on its filesystem (written until ENOSPC)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)


EDGE_CASES: list[Callable[[Bench], None]] = [
    case_namespace_exemption,
    case_ids_past_64_bits,
    case_error_shapes,
    case_closed_pipe,
    case_absurd_burst,
    case_node_read_only,
    case_default_node,
    case_missing_store,
    case_full_disk,
]


def main() -> int:
    if os.geteuid() != 0:
        print("bench/security_edges.py makes Unix users: run it as root", file=sys.stderr)
        return 2
    with socket_port() as port:
        pass
    with setup() as (people, root):
        daemon = main_daemon(root, people.group, port)
        b = Bench(root, people.alice, people.bob, people.carol, people.group, daemon, port)
        try:
            b.job = b.submit(b.alice, "sh", "-c", "echo edge; exec sleep 300")
            for case in EDGE_CASES:
                attempt(b, case)
        finally:
            daemon.stop()
            _kill_jobs(daemon)
            for process in b.processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            for path in b.dirs:
                remove_tree(path)
    print(f"gpupool security cases of issue 35 on a simulated {SPEC}\n")
    print(table(b))
    failed = [row for row in b.rows if not row.contained]
    print(f"\n{len(b.rows) - len(failed)} of {len(b.rows)} attempts contained")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
