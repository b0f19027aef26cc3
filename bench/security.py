"""The known attacks on a shared daemon, tried for real: every case refused or contained, on
real daemons, as two ordinary users of the socket group (alice, bob), one user outside it
(carol), and root.

    python bench/security.py        # as root: it creates (and removes) users and groups

Makes three real Unix users and a fresh socket group holding alice and bob, then starts, under a
directory every user may enter, a root daemon on a simulated 1xA100-40GB node with that socket
group, a 64 MiB log cap, a TCP listener with a token file, and `--watchdog kill` with one
exemption by path; plus, for the cases about starting and stopping, a few more daemons (one run
by alice). Each case is done as the person named (their own uid, gid and groups, through the CLI,
HTTP over the socket or TCP, or plain file operations) and the answer is recorded as observed.
Prints a markdown table (case, tried as, what was tried, what happened, verdict) and the daemon's
memory while a job writes 1 GiB to stderr without a newline; exits 1 when a case is not
contained. Then times `gpupool ps --all` in another daemon over its socket with 10,000 finished
jobs, before and after a prune (bench/ps_latency.py times the route alone, in-process); a
timing is printed, not counted in the exit status: on a busy machine it says little about a
case. Everything it made is removed at the end, on failure too. docs/benchmarks/security.md
records a run. The router's cases (bench/security_router.py) start a daemon with a router.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from daemon import _rss_mib  # noqa: E402
from daemon_support import machine_load, percentile  # noqa: E402
from ps_latency import fill  # noqa: E402
from security_edges import EDGE_CASES  # noqa: E402
from security_router import case_router  # noqa: E402
from security_support import (  # noqa: E402
    LOG_CAP,
    SPEC,
    TOKEN,
    XORG,
    Bench,
    GiB,
    MiB,
    People,
    attempt,
    last_line,
    main_daemon,
    refused_line,
    said,
    serve_once,
    setup,
    table,
)
from soak_support import SUBMITTER, gpu_uuids, slots_in_use  # noqa: E402
from tests.agent.conftest import _kill_jobs  # noqa: E402
from tests.agent.daemon_support import CUDA_JOB, Daemon, cli, until  # noqa: E402
from tests.agent.test_daemon_recovery import socket_port  # noqa: E402
from tests.agent.test_jobfiles_daemon import _peak_rss  # noqa: E402
from tests.agent.test_multiuser_access import http_as  # noqa: E402
from tests.agent.test_robust_store import corrupt_an_index, hold_write_lock  # noqa: E402
from tests.agent.watchdog_support import ESCAPE_MIB, wait_for_event  # noqa: E402
from tests.users import User, gpupool_as, remove_tree, run_as, user_env, world_dir  # noqa: E402

from gpupool.agent.agent import Agent, AgentConfig  # noqa: E402
from gpupool.agent.jobs import JobSpec  # noqa: E402
from gpupool.agent.store import Store  # noqa: E402
from gpupool.devices.factory import open_backend  # noqa: E402
from gpupool.isolation.libraries import native_libraries  # noqa: E402

RSS_TARGET = 50 * MiB
#: the listing's finished jobs after pruning, and the older ones pruned (OLD_S old: older than
#: `prune --older-than 7d` takes, younger than the daemon's own 14 days)
LISTED = 10_000
OLD = 1_000
OLD_S = 10 * 86400
CALLS = 100
SECRET = "alice-secret-output"
#: case 7: the job makes its own accounting region a FIFO (its share's directory is its own)
_FIFO_JOB = (
    "import os, time\n"
    "region = os.environ['GPUPOOL_SHARED_REGION']\n"
    "if os.path.exists(region): os.unlink(region)\n"
    "os.mkfifo(region)\n"
    "print('ready', flush=True)\n"
    "time.sleep(300)\n"
)


# --- the cases, in the order but for the stop (15), last: it ends the shared daemon ----


def case_socket_group(b: Bench) -> None:
    c = "1 socket group"
    share = ["--compute", "10", "--name", "alice-long", "--env", "TOKEN=alice-env"]
    done = b.gpupool(b.alice, "submit", *share, "--", "sh", "-c", f"echo {SECRET}; exec sleep 300")
    ok = done.returncode == 0 and done.stdout.strip().isdigit()
    b.job = int(done.stdout.strip()) if ok else 0
    b.record(
        c,
        "alice (in the group)",
        "`gpupool submit --compute 10 -- sh -c '...; sleep 300'`",
        f"exit {done.returncode}, job {done.stdout.strip()}",
        ok,
    )
    job = b.daemon.wait(b.job, ("running",)) if ok else {}
    pids = b.jobdir(b.job) / "pids.json"
    until(pids.exists)
    process = json.loads(pids.read_text())["job"]
    uids = next(
        line.split()[1:]
        for line in Path(f"/proc/{process}/status").read_text().splitlines()
        if line.startswith("Uid:")
    )
    b.record(
        c,
        "root",
        f"whose is job {b.job}, as whom does its process run",
        f"state {job.get('state')}, user {job.get('user')}; pid {process} real/effective uid "
        f"{uids[0]}/{uids[1]} (alice is {b.alice.uid})",
        job.get("state") == "running"
        and job.get("user") == b.alice.name
        and uids[:2] == [str(b.alice.uid)] * 2,
    )
    ps = b.gpupool(b.carol, "ps")
    b.record(c, "carol (not in it)", "`gpupool ps`", said(ps), refused_line(ps))
    probe = run_as(
        b.carol,
        [
            sys.executable,
            "-c",
            "import errno, socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
            "try: s.connect(sys.argv[1]); print('connected')\n"
            "except OSError as e: print(errno.errorcode[e.errno], e.strerror)",
            str(b.sock),
        ],
    )
    b.record(
        c,
        "carol",
        "connect(2) to the socket",
        probe.stdout.strip(),
        probe.stdout.startswith("EACCES"),
    )


def case_state_dir(b: Bench) -> None:
    c = "2 state dir"
    shared = b.root / "shared"  # as /tmp: anyone may make a directory there
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "state"
    run_as(b.alice, ["mkdir", "-m", "700", str(theirs)])
    open_to_group = b.root / "group-writable"
    open_to_group.mkdir()
    open_to_group.chmod(0o770)
    real = b.root / "real"
    real.mkdir(mode=0o700)
    linked = b.root / "linked"
    linked.symlink_to(real)
    for n, (how, path) in enumerate(
        [
            ("made (and owned) by alice, 0700", theirs),
            ("root's, mode 0770 (group-writable)", open_to_group),
            ("a symbolic link to root's 0700 directory", linked),
        ]
    ):
        node = b.root / f"node-refused-{n}"
        code, err = serve_once(
            "--simulate", "1xA30", "--node-dir", str(node), "--state-dir", str(path)
        )
        # nothing made in it, nor where the link points
        untouched = not any(path.iterdir()) and not any(real.iterdir())
        b.record(
            c,
            "root",
            f"`gpupool serve --state-dir` on a state dir {how}",
            f"exit {code}: {last_line(err)}; the directory left {'empty' if untouched else 'USED'}",
            code not in (None, 0) and err.count("\n") == 1 and untouched,
        )


def case_planted_link(b: Bench) -> None:
    c = "3 planted link"
    secret = b.root / "root-secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    following = max(b.job_ids()) + 1
    for tried, argv in (
        (
            f"`ln -s` a link as the next job's directory (jobs/{following})",
            ["ln", "-s", str(secret), str(b.jobdir(following))],
        ),
        (
            f"`ln -sf` a link over her own job's log (jobs/{b.job}/stdout)",
            ["ln", "-sf", str(secret), str(b.jobdir(b.job) / "stdout")],
        ),
        (f"`mkdir jobs/{following}` to plant in it", ["mkdir", str(b.jobdir(following))]),
    ):
        done = run_as(b.alice, argv)
        ok = done.returncode != 0 and "Permission denied" in done.stderr
        b.record(c, "alice", tried, f"exit {done.returncode}: {last_line(done.stderr)}", ok)
    # an attacker who could write there (simulated by root) plants both logs before the job
    planted = b.jobdir(following)
    planted.mkdir(mode=0o700)
    (planted / "stdout").symlink_to(secret)
    (planted / "stderr").symlink_to(secret)
    job = b.submit(b.alice, "sh", "-c", "echo written-out; echo written-err >&2")
    ended = b.daemon.wait(job)
    log = planted / "stdout"
    found = log.lstat()
    untouched = secret.read_text() == "root only\n" and secret.stat().st_uid == 0
    regular = (
        not log.is_symlink() and found.st_uid == b.alice.uid and log.read_text() == "written-out\n"
    )
    b.record(
        c,
        "root (as an attacker who could), then alice",
        f"links jobs/{following}/stdout, stderr -> a root 0600 file; "
        f"alice's job {job} prints to both",
        f"job {job} {ended['state']} (id {'as planted' if job == following else 'other'}); "
        f"the target {'untouched' if untouched else 'WRITTEN'}; stdout a regular file of "
        f"alice's 0{found.st_mode & 0o777:o}: {log.read_text().strip()!r}",
        job == following and untouched and regular,
    )


def case_user_daemon(b: Bench) -> None:
    c = "4 a user's daemon"
    root = world_dir()
    b.dirs.append(root)
    os.chown(root, b.alice.uid, b.alice.gid)
    state = root / "state"
    sock = state / "gpupool.sock"
    log = (b.root / "alice-serve.log").open("w")
    serve = ["serve", "--simulate", "1xA30", "--node-dir", str(root / "node"), "--state-dir"]
    process = subprocess.Popen(
        [sys.executable, "-m", "gpupool", *serve, str(state)],
        user=b.alice.uid,
        group=b.alice.gid,
        env=user_env(b.alice),
        stdout=log,
        stderr=log,
    )
    b.processes.append(process)
    try:
        url = f"unix://{sock}"
        assert until(
            lambda: sock.exists() and http_as(b.alice, sock, "GET", "/v1/health")[0] == 200, 60
        )
        ran = root / "ran-as-alice"
        argv = ["touch", str(ran)]
        done = gpupool_as(b.bob, "submit", "--", *argv, url=url)
        b.record(
            c,
            "bob",
            "`gpupool submit` to alice's daemon (state dir 0700, socket 0600)",
            said(done),
            refused_line(done),
        )
        # alice opens her daemon to everyone: the daemon still serves her only
        run_as(b.alice, ["chmod", "755", str(state)])
        run_as(b.alice, ["chmod", "666", str(sock)])
        done = gpupool_as(b.bob, "submit", "--", *argv, url=url)
        b.record(
            c,
            "bob",
            "the same once alice made them 0755 and 0666",
            said(done),
            refused_line(done, 6) and "serves" in done.stderr,
        )
        answer = b.request(
            b.bob, "POST", "/v1/jobs", json.dumps({"argv": argv, "workdir": "/"}), sock=sock
        )
        b.record(
            c,
            "bob",
            "`POST /v1/jobs` over that socket",
            str(answer),
            answer.status == 403 and "serves" in answer.message,
        )
        status, data = http_as(User("root", 0, 0), sock, "GET", "/v1/jobs")
        b.record(
            c,
            "root",
            "`GET /v1/jobs` on alice's daemon",
            f"{status} {data.get('message')}",
            status == 403,
        )
        time.sleep(1)  # a job would have been started by now
        mine = gpupool_as(b.alice, "ps", "--all", "--json", url=url)
        listed = json.loads(mine.stdout)["jobs"] if mine.returncode == 0 else None
        jobs = list((state / "jobs").iterdir()) if (state / "jobs").exists() else []
        b.record(
            c,
            "alice",
            "`gpupool ps --all`: did bob's job run as her",
            f"{len(listed or [])} jobs listed, {len(jobs)} job directories, "
            f"{'a file' if ran.exists() else 'no file'} at the job's target",
            listed == [] and not jobs and not ran.exists(),
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        log.close()


def case_private(b: Bench) -> None:
    c = "5 alice's job, read by bob"
    job = b.job
    for args in (("logs", str(job)), ("describe", str(job))):
        done = b.gpupool(b.bob, *args)
        b.record(
            c,
            "bob",
            f"`gpupool {' '.join(args)}`",
            said(done),
            refused_line(done, 6) and SECRET not in done.stdout,
        )
    for path in (f"/v1/jobs/{job}/logs", f"/v1/jobs/{job}"):
        status, data = http_as(b.bob, b.sock, "GET", path)
        b.record(
            c,
            "bob",
            f"`GET {path}`",
            f"{status} {data.get('message')}",
            status == 403 and SECRET not in json.dumps(data),
        )
    for name in (f"jobs/{job}/stdout", f"jobs/{job}/launch.json", "state.db", "state.db-wal"):
        done = run_as(b.bob, ["cat", str(b.state / name)])
        b.record(
            c,
            "bob",
            f"`cat .../state/{name}`",
            f"exit {done.returncode}: {last_line(done.stderr)}",
            done.returncode != 0 and "Permission denied" in done.stderr,
        )
    listed = b.gpupool(b.bob, "ps", "--json")
    rows = json.loads(listed.stdout)["jobs"] if listed.returncode == 0 else []
    theirs = [row for row in rows if row["id"] == job]
    plain = b.gpupool(b.bob, "ps").stdout
    shown = theirs[0] if theirs else {}
    b.record(
        c,
        "bob",
        "`gpupool ps` and `ps --json`",
        f"job {job} listed: user {shown.get('user')}, compute {shown.get('compute')}, "
        f"command {shown.get('command')}; the command in `ps`'s table: "
        f"{'yes' if 'sleep 300' in plain else 'no'}",
        bool(theirs)
        and shown.get("command") is None
        and SECRET not in plain
        and "sleep 300" not in plain,
    )


def case_admin_only(b: Bench) -> None:
    c = "6 admin operations"
    drain = b.gpupool(b.bob, "drain")
    cancel = b.gpupool(b.bob, "cancel", str(b.job))
    node = b.daemon.call("GET", "/v1/node")
    state = b.daemon.job(b.job)["state"]
    b.record(
        c,
        "bob",
        "`gpupool drain`",
        f"{said(drain)}; node draining: {node['draining']}",
        refused_line(drain, 6) and not node["draining"],
    )
    b.record(
        c,
        "bob",
        f"`gpupool cancel {b.job}` (alice's)",
        f"{said(cancel)}; job {state}",
        refused_line(cancel, 6) and state == "running",
    )


def case_fifo_region(b: Bench) -> None:
    c = "7 FIFO region"
    job = b.submit(b.alice, sys.executable, "-c", _FIFO_JOB)
    stdout = b.jobdir(job) / "stdout"
    ready = until(lambda: stdout.exists() and stdout.read_text() == "ready\n", 30)
    shares = [p for p in b.jobdir(job).iterdir() if p.name.startswith("gpupool-share-")]
    region = shares[0] / "region" if shares else None
    is_fifo = region is not None and region.is_fifo()
    slowest, statuses = 0.0, set()
    with b.local() as client:
        for _ in range(50):
            began = time.monotonic()
            statuses.add(client.get("/metrics").status_code)
            slowest = max(slowest, time.monotonic() - began)
    b.record(
        c,
        "alice",
        f"job {job} replaces its region with a FIFO, then root scrapes `/metrics` 50 times",
        f"region a FIFO: {is_fifo}; answers {sorted(statuses)}, slowest {slowest * 1000:.0f} ms",
        bool(ready) and is_fifo and statuses == {200} and slowest < 2,
    )
    for user, args, want in (
        (b.alice, ("ps",), 0),
        (b.bob, ("ps",), 0),
        (None, ("ps",), 0),
        (b.alice, ("logs", str(job)), 0),
        (b.bob, ("cancel", str(job)), 6),
        (b.alice, ("cancel", str(job)), 0),
    ):
        began = time.monotonic()
        done = b.gpupool(user, *args)
        took = time.monotonic() - began
        b.record(
            c,
            b.names(user),
            f"`gpupool {' '.join(args)}` meanwhile",
            f"{said(done) if done.returncode else 'exit 0'} in {took:.1f} s (the CLI included)",
            done.returncode == want and took < 10,
        )
    b.figures["case 7, the slowest of 50 scrapes of /metrics"] = f"{slowest * 1000:.0f} ms"


def case_surrogate(b: Bench) -> None:
    c = "8 lone surrogate"
    before = b.job_ids()
    body = '{"argv": ["true"], "workdir": "/", "name": "\\ud800"}'
    answer = b.request(b.alice, "POST", "/v1/jobs", body)
    stored = b.job_ids() != before
    b.record(
        c,
        "alice",
        'raw JSON `{"name": "\\ud800", ...}` to `POST /v1/jobs`',
        f"{answer}; stored: {'yes' if stored else 'nothing'}",
        answer.status == 400 and not stored,
    )
    with b.local() as client:
        seen = {
            path: client.get(path).status_code
            for path in ("/v1/jobs?all=true", "/v1/dashboard", "/", "/metrics")
        }
    b.record(
        c,
        "root",
        "then the listing, the dashboard (`/v1/dashboard`, `/`) and `/metrics`",
        ", ".join(f"{path} {code}" for path, code in seen.items()),
        set(seen.values()) == {200},
    )


def case_flood(b: Bench) -> None:
    c = "9 1 GiB on stderr"
    assert b.daemon.process is not None
    pid = b.daemon.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM counts from here
    rss_before, peak_before = _rss_mib(pid) * MiB, _peak_rss(pid)
    flood = f"head -c {GiB} /dev/zero | tr '\\0' x >&2"
    began = time.monotonic()
    job = b.submit(b.alice, "sh", "-c", flood)
    highest = rss_before
    while b.daemon.job(job)["state"] not in ("succeeded", "failed", "cancelled"):
        highest = max(highest, _rss_mib(pid) * MiB)
        if time.monotonic() - began > 150:
            raise RuntimeError("the 1 GiB job did not end in 150 s")
        time.sleep(0.1)
    took = time.monotonic() - began
    written = _peak_rss(pid) - peak_before
    # then alice reads the whole capped log back through the daemon (1 MiB per request)
    read = run_as(
        b.alice,
        ["sh", "-c", f"{sys.executable} -m gpupool logs {job} 2>&1 >/dev/null | wc -c"],
        env={"GPUPOOL_URL": b.daemon.url},
        timeout=120,
    )
    grown = _peak_rss(pid) - peak_before
    log = b.jobdir(job) / "stderr"
    size = log.stat().st_size
    with log.open("rb") as err:
        head = err.read(64).split(b"\n", 1)[0].decode()
    dropped = int(head.split()[1]) if head.startswith("[gpupool: ") else -1
    b.record(
        c,
        "alice",
        f"job {job}: `head -c 1G /dev/zero | tr '\\0' x >&2` (one line of 1 GiB), "
        "then `gpupool logs` of it",
        f"ended in {took:.0f} s; the daemon's peak (VmHWM) grew {written / MiB:.1f} MiB by the "
        f"job's end, {grown / MiB:.1f} MiB with the read-back",
        written <= RSS_TARGET and grown <= RSS_TARGET,
    )
    b.record(
        c,
        "root",
        f"the log on disk (`--max-log-size {LOG_CAP}`)",
        f"{size / MiB:.1f} MiB, first line {head!r}, {dropped + size - len(head) - 1} of {GiB} "
        f"bytes kept or counted; alice read back {read.stdout.strip()} bytes",
        size <= 64 * MiB and dropped > 0 and dropped + size - len(head) - 1 == GiB,
    )
    b.figures["case 9, the daemon's memory while a job writes 1 GiB to stderr"] = (
        f"VmRSS {rss_before / MiB:.1f} MiB before, at most {highest / MiB:.1f} MiB while it ran "
        f"(sampled every 0.1 s); VmHWM {peak_before / MiB:.1f} MiB before, "
        f"{(peak_before + written) / MiB:.1f} MiB at the job's end (+{written / MiB:.1f} MiB), "
        f"{(peak_before + grown) / MiB:.1f} MiB after alice read the {size / MiB:.0f} MiB log "
        f"back (+{grown / MiB:.1f} MiB); target +50 MiB at most. The job took {took:.0f} s"
    )


def case_huge_name(b: Bench) -> None:
    c = "10 30 MB name"
    before = b.job_ids()
    body = '{"argv": ["true"], "workdir": "/", "name": "' + "x" * 30_000_000 + '"}'
    for how, chunked in (
        ("announced (Content-Length)", False),
        ("streamed (chunked, no length)", True),
    ):
        answer = b.request(b.alice, "POST", "/v1/jobs", body, chunked=chunked)
        stored = b.job_ids() != before
        b.record(
            c,
            "alice",
            f"`POST /v1/jobs`, a 30 MB name, {how}",
            f"{answer} in {answer.seconds:.2f} s; stored: {'yes' if stored else 'nothing'}",
            answer.status == 413 and not stored,
        )


def case_removed_state(b: Bench) -> None:
    c = "11 `rm -rf` state"
    root = world_dir()
    b.dirs.append(root)
    daemon = Daemon(root, "1xA30").start()
    try:
        shutil.rmtree(daemon.state_dir)
        began = time.monotonic()
        assert daemon.process is not None
        try:
            code: int | None = daemon.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - began
        line = last_line((root / "serve.log").read_text())
        b.record(
            c,
            "root",
            "`rm -rf` the running daemon's state dir",
            f"exit {code} after {took:.1f} s: {line}",
            code == 7 and "was removed or replaced" in line,
        )
    finally:
        daemon.stop()


def case_locked_store(b: Bench) -> None:
    c = "12 locked store"
    before = b.job_ids()
    holder = hold_write_lock(b.state / "state.db", 6)  # root's: only root can open state.db
    try:
        with b.local() as client:
            began = time.monotonic()
            health = client.get("/v1/health").status_code
            health_s = time.monotonic() - began
        body = json.dumps({"argv": ["true"], "workdir": "/"})
        answer = b.request(b.alice, "POST", "/v1/jobs", body)
    finally:
        holder.join()
    stored = b.job_ids() != before
    b.record(
        c,
        "root holds the write lock (`BEGIN EXCLUSIVE`, 6 s); alice submits",
        "`GET /v1/health` (root), then `POST /v1/jobs` (alice)",
        f"health {health} in {health_s * 1000:.0f} ms; submit {answer} in "
        f"{answer.seconds:.2f} s, Retry-After {answer.headers.get('retry-after')}; "
        f"stored: {'yes' if stored else 'nothing'}",
        health == 200
        and health_s < 1
        and answer.status == 503
        and answer.headers.get("retry-after") == "1"
        and answer.seconds <= 2
        and not stored,
    )


def case_corrupt_store(b: Bench) -> None:
    c = "13 corrupt index"
    state = b.root / "corrupt" / "state"
    state.mkdir(parents=True, mode=0o700)
    store = Store(state / "state.db")
    for _ in range(20):
        store.add(JobSpec(("true",)), 0, "root")
    store.close()
    corrupt_an_index(state / "state.db")
    node = b.root / "corrupt" / "node"
    code, err = serve_once(
        "--simulate", "1xA30", "--node-dir", str(node), "--state-dir", str(state)
    )
    b.record(
        c,
        "root",
        "`gpupool serve` on a state.db whose jobs index is garbage",
        f"exit {code}: {err.strip()}",
        code == 2 and err.count("\n") == 1,
    )


def case_tcp(b: Bench) -> None:
    c = "14 TCP"
    base = f"http://127.0.0.1:{b.port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, timeout=30) as web:
        rebound = web.get("/v1/health", headers={**auth, "Host": f"evil.example:{b.port}"})
        b.record(
            c,
            "a page at evil.example resolved to 127.0.0.1 (DNS rebinding)",
            "`GET /v1/health`, `Host: evil.example`, with the token",
            f"{rebound.status_code} {rebound.json().get('message')}",
            rebound.status_code == 400,
        )
        form = web.post(f"/v1/jobs/{b.job}/cancel", data={"x": "1"}, headers=auth)
        state = b.daemon.job(b.job)["state"]
        b.record(
            c,
            "a cross-site HTML form (with the token, even)",
            f"`POST /v1/jobs/{b.job}/cancel` as application/x-www-form-urlencoded",
            f"{form.status_code} {form.json().get('message')}; job {state}",
            form.status_code == 415 and state == "running",
        )
        odd = web.get("/v1/jobs", headers={b"Authorization": "Bearer s3cr\xe9t".encode("latin-1")})
        b.record(
            c,
            "a TCP client",
            "`GET /v1/jobs`, `Authorization: Bearer s3cr\\xe9t` (not ASCII)",
            f"{odd.status_code} {odd.json().get('message')}",
            odd.status_code == 401,
        )
        for path in ("/docs", "/openapi.json"):
            bare = web.get(path)
            b.record(
                c,
                "a TCP client, no token",
                f"`GET {path}`",
                f"{bare.status_code} {bare.json().get('message')}",
                bare.status_code == 401,
            )
        moved = web.get("/", params={"token": TOKEN})
        cookie = moved.headers.get("set-cookie", "")
        session = web.cookies.get("gpupool_session") or ""
        board = web.get("/v1/dashboard").status_code
        jobs = web.get("/v1/jobs").status_code
        cancel = web.post(f"/v1/jobs/{b.job}/cancel", json={}).status_code
        b.record(
            c,
            "a browser opening `/?token=TOKEN`",
            "the session cookie, then the API with it",
            f"{moved.status_code} to {moved.headers.get('location')}; cookie UID.EXPIRY.MAC "
            f"({session.count('.') + 1} parts), the token in it: "
            f"{'yes' if TOKEN in cookie else 'no'}; "
            f"`/v1/dashboard` {board}, `/v1/jobs` {jobs}, cancel {cancel}",
            moved.status_code == 303
            and TOKEN not in cookie
            and board == 200
            and jobs == 401
            and cancel == 401,
        )
    loose = b.root / "token-0644"
    loose.write_text(TOKEN + "\n")
    loose.chmod(0o644)
    code, err = serve_once(*b.fresh("token"), "--listen", "127.0.0.1:1", "--token-file", str(loose))
    b.record(
        c,
        "root",
        "`gpupool serve --listen ... --token-file` a 0644 token file",
        f"exit {code}: {err.strip()}",
        code == 2 and err.count("\n") == 1,
    )


def case_exemptions(b: Bench) -> None:
    c = "16 watchdog exemption"
    code, err = serve_once(*b.fresh("exempt"), "--watchdog-exempt", "Xorg")
    b.record(
        c,
        "root",
        "`gpupool serve --watchdog-exempt Xorg` (a name)",
        f"exit {code}: {err.strip()}",
        code == 2 and err.count("\n") == 1,
    )
    # bob runs a CUDA program that calls itself Xorg: comm from a link named Xorg, argv[0] the
    # exempt path; what it runs (/proc/PID/exe) is the interpreter
    bindir = b.root / "impostor"
    bindir.mkdir(mode=0o755)
    (bindir / "Xorg").symlink_to(sys.executable)
    env = user_env(
        b.bob,
        {
            "LD_LIBRARY_PATH": str(native_libraries().sim_dir),
            "GPUPOOL_SIM_NODE": str(b.daemon.node_dir),
        },
    )
    impostor = subprocess.Popen(
        [XORG, CUDA_JOB, "60", str(ESCAPE_MIB)],
        executable=str(bindir / "Xorg"),
        user=b.bob.uid,
        group=b.bob.gid,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    b.processes.append(impostor)
    comm = until(lambda: Path(f"/proc/{impostor.pid}/comm").read_text().strip(), 5)
    event = wait_for_event(b.daemon, lambda e: e["pid"] == impostor.pid, timeout=20)
    try:
        code = impostor.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = None
    b.record(
        c,
        "bob (outside gpupool)",
        f"a CUDA process named {comm} (argv[0] {XORG}); the daemon exempts {XORG} by path",
        f"event `{event['kind']}`: {event['detail']}; the process ended by signal {-(code or 0)}",
        event["kind"] == "no_job" and code == -signal.SIGKILL,
    )


def case_arbiter_slots(b: Bench) -> None:
    """More arbitrated jobs than a GPU has arbiter slots (64), then one that computes: it must
    still be arbitrated, not killed as a compute escape."""
    c = "18 arbiter slots"
    body = json.dumps({"argv": ["true"], "workdir": "/", "memory": "1Gi", "compute": 5})
    argv = [sys.executable, "-c", SUBMITTER, b.daemon.url, "70", "8", body]
    done = run_as(b.alice, argv, timeout=300)
    ids = {int(word) for word in done.stdout.split()}
    until(lambda: not ids & {j["id"] for j in b.daemon.call("GET", "/v1/jobs")["jobs"]}, 180)
    slots = slots_in_use(b.daemon, gpu_uuids(b.daemon))
    share = ("--compute", "30", "--memory", "1Gi")
    job = b.submit(b.alice, sys.executable, CUDA_JOB, "10", "256", share=share)
    stdout = b.jobdir(job) / "stdout"
    until(lambda: stdout.exists() and "holding" in stdout.read_text(), 30)
    time.sleep(5)  # the watchdog tells a compute escape within 2.5 s
    state = b.daemon.job(job)["state"]
    kinds = [e["kind"] for e in b.daemon.job(job)["events"]]
    b.record(
        c,
        "alice",
        "70 jobs `--compute 5 --memory 1Gi -- true` (8 connections at once), then a 30 % job "
        "that computes (`--watchdog kill`)",
        f"{len(ids)} jobs ended; arbiter slots in use after them: {slots[0]} of 64; the 30 % "
        f"job {state} 5 s after it began computing; compute_escape events: "
        f"{kinds.count('compute_escape')}",
        len(ids) == 70 and slots[0] < 64 and state == "running" and "compute_escape" not in kinds,
    )


def case_prune(b: Bench) -> None:
    c = "17 prune"
    listed = b.daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"]
    finished = [job["id"] for job in listed if job["state"] in ("succeeded", "failed", "cancelled")]
    done = b.gpupool(b.bob, "prune", "--older-than", "0s")
    left = b.job_ids()
    b.record(
        c,
        "bob",
        "`gpupool prune --older-than 0s`",
        f"{said(done)}; jobs left: {len(left)} of {len(listed)}",
        refused_line(done, 6) and len(left) == len(listed),
    )
    done = b.gpupool(None, "prune", "--older-than", "0s")
    after = b.daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"]
    dirs = [job for job in finished if b.jobdir(job).exists()]
    db = sqlite3.connect(f"file:{b.state / 'state.db'}?mode=ro", uri=True)
    marks = ",".join("?" * len(finished))
    events = db.execute(
        f"SELECT count(*) FROM events WHERE job_id IN ({marks})", finished
    ).fetchone()[0]
    db.close()
    kept = sorted(job["state"] for job in after)
    b.record(
        c,
        "root",
        "`gpupool prune --older-than 0s`",
        f"exit {done.returncode}: {done.stdout.strip() or last_line(done.stderr)}; "
        f"{len(finished)} finished jobs before, left: {len(after)} ({', '.join(kept)}); "
        f"their directories left {len(dirs)}, their events left {events}",
        done.returncode == 0
        and all(state in ("running", "queued") for state in kept)
        and not dirs
        and events == 0,
    )


def case_sigterm(b: Bench) -> None:
    c = "15 SIGTERM"
    pids = json.loads((b.jobdir(b.job) / "pids.json").read_text())
    b.daemon.kill(signal.SIGTERM)
    assert b.daemon.process is not None
    code = b.daemon.process.returncode
    line = last_line((b.root / "serve.log").read_text())
    try:
        os.kill(pids["job"], 0)
        alive = True
    except ProcessLookupError:
        alive = False
    b.record(
        c,
        "root",
        f"`kill -TERM` the daemon; alice's job {b.job} running",
        f"exit {code}; socket {'left' if b.sock.exists() else 'removed'}; last line: {line}; "
        f"job {b.job} {'still running' if alive else 'GONE'}",
        code == 0 and not b.sock.exists() and line.startswith("gpupool serve: stopped") and alive,
    )


CASES: list[Callable[[Bench], None]] = [
    case_socket_group,
    case_state_dir,
    case_planted_link,
    case_user_daemon,
    case_private,
    case_admin_only,
    case_fifo_region,
    case_surrogate,
    case_flood,
    case_huge_name,
    case_removed_state,
    case_locked_store,
    case_corrupt_store,
    case_tcp,
    case_exemptions,
    case_arbiter_slots,
    case_prune,
    *EDGE_CASES,  # issue 35's, while the shared daemon still runs
    case_router,
    case_sigterm,
]


def _cpu_ns(pid: int) -> int:
    """The CPU time of every thread of `pid` so far, in ns (a request runs on a worker thread;
    /proc/PID/stat counts in 10 ms ticks, too coarse for one call)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total


def listing(b: Bench) -> list[str]:
    """`gpupool ps --all` (GET /v1/jobs?all=true) in a real daemon over its socket, with LISTED
    recent finished jobs and OLD older ones, then after `gpupool prune --older-than 7d` took the
    older: root's first call, then CALLS calls each as root (who sees every command) and as bob
    (who owns none of them), timed by the caller, and the daemon's CPU per call; a markdown
    table."""
    base = world_dir()
    b.dirs.append(base)
    (base / "state").mkdir(mode=0o700)
    with open_backend(SPEC, base / "node") as backend:
        agent = Agent(AgentConfig(base / "state"), backend)
        fill(agent, OLD + LISTED)
        with agent.store.transaction() as db:
            db.execute(
                "UPDATE jobs SET submitted_at = submitted_at - ?, started_at = started_at - ?, "
                "finished_at = finished_at - ? WHERE id <= ?",
                (OLD_S, OLD_S, OLD_S, OLD),
            )
        agent.store.close()
    daemon = Daemon(base, SPEC, ("--socket-group", b.group)).start()
    assert daemon.process is not None
    pid = daemon.process.pid
    sock = daemon.state_dir / "gpupool.sock"
    lines = [
        "| finished jobs | as | first call ms | n | wall p50 ms | wall p99 ms | wall max ms | "
        "daemon CPU mean ms | daemon CPU p99 ms | p99 <= 100 ms (wall; daemon CPU) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    transport = httpx.HTTPTransport(uds=str(sock))
    try:
        with httpx.Client(transport=transport, base_url="http://gpupool", timeout=60) as web:
            for stage in ("before", "after"):
                if stage == "after":
                    pruned = cli("prune", "--older-than", "7d", url=daemon.url, timeout=120)
                    b.figures["the listing's pruning"] = (
                        f"`gpupool prune --older-than 7d`: {pruned.stdout.strip()}"
                    )

                def timed() -> tuple[float, float]:
                    """One call's wall time (here) and the daemon's CPU time, in ms."""
                    began, spent = time.monotonic(), _cpu_ns(pid)
                    answer = web.get("/v1/jobs", params={"all": "true"})
                    assert answer.status_code == 200
                    return (time.monotonic() - began) * 1000, (_cpu_ns(pid) - spent) / 1e6

                first, _ = timed()  # the first after the start or the prune: every job encoded
                count = len(daemon.call("GET", "/v1/jobs", params={"all": True})["jobs"])
                root_wall, root_cpu = zip(*(timed() for _ in range(CALLS)), strict=True)
                spent = _cpu_ns(pid)
                bobs = b.request(b.bob, "GET", "/v1/jobs?all=true", sock=sock, repeat=CALLS)
                assert bobs.status == 200, bobs
                bob_mean = (_cpu_ns(pid) - spent) / 1e6 / CALLS
                # bob's calls come from his own process: the daemon's CPU per call is a mean
                for who, wall, cpu, opened in (
                    ("root", list(root_wall), list(root_cpu), f"{first:.0f}"),
                    ("bob", [t * 1000 for t in bobs.times], [bob_mean], "-"),
                ):
                    p99, cpu_p99 = percentile(wall, 99), percentile(cpu, 99)
                    met = [
                        "met" if p99 <= 100 else "not met",
                        "-" if who == "bob" else "met" if cpu_p99 <= 100 else "not met",
                    ]
                    lines.append(
                        f"| {count} ({stage} pruning) | {who} | {opened} | {len(wall)} | "
                        f"{percentile(wall, 50):.1f} | {p99:.1f} | {max(wall):.1f} | "
                        f"{sum(cpu) / len(cpu):.1f} | "
                        f"{'-' if who == 'bob' else f'{cpu_p99:.1f}'} | {'; '.join(met)} |"
                    )
    finally:
        daemon.stop()
    return lines


def run(people: People, root: Path) -> tuple[Bench, list[str]]:
    """Every case on the shared daemon (and the others they need), then the listing's times."""
    with socket_port() as port:
        pass
    daemon = main_daemon(root, people.group, port)
    b = Bench(root, people.alice, people.bob, people.carol, people.group, daemon, port)
    times: list[str] = []
    try:
        for case in CASES:
            began = time.monotonic()
            attempt(b, case)
            print(f"{case.__name__}: {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
        began = time.monotonic()
        try:
            times = listing(b)
        except Exception as err:  # a broken measurement is said, the cases still count
            times = [f"the listing's times broke down: {type(err).__name__}: {err}"]
        print(f"listing: {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    finally:
        daemon.stop()
        _kill_jobs(daemon)
        for process in b.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for path in b.dirs:
            remove_tree(path)
    return b, times


def main() -> int:
    if os.geteuid() != 0:
        print(
            "bench/security.py makes Unix users and root daemons: run it as root", file=sys.stderr
        )
        return 2
    began = time.monotonic()
    load = machine_load()
    with setup() as (people, root):
        b, times = run(people, root)
    took = time.monotonic() - began
    print(f"gpupool security cases on a simulated {SPEC}; {load}; {took:.0f} s in all\n")
    print(table(b))
    print()
    for name, figure in b.figures.items():
        print(f"- {name}: {figure}")
    print(f"\n`gpupool ps --all` in a daemon over its socket, {machine_load()}:\n")
    print("\n".join(times))
    failed = [row for row in b.rows if not row.contained]
    print(f"\n{len(b.rows) - len(failed)} of {len(b.rows)} attempts contained")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
