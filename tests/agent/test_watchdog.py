"""The watchdog against a real daemon on a simulated node: each escape of issue 11 from a 2 GiB
share, and a process the daemon never started, is reported within 5 s from the driver's view;
with `--watchdog kill` the offending processes die and the kill is recorded."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import CUDA_JOB, Daemon, cli, scrape
from tests.agent.watchdog_support import (
    ESCAPE_MIB,
    ESCAPES,
    HELD_MIB,
    SHARE,
    build_dlvsym,
    escape_command,
    foreign_process,
    graphics_process,
    job_stdout,
    pids_in,
    wait_for_event,
    wait_for_job_event,
    wait_for_line,
    wait_gone,
)

from gpupool.agent.watchdog import kill
from gpupool.devices.procfs import process_start_time

REPORT_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def dlvsym_prog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dlvsym(tmp_path_factory.mktemp("progs") / "escape_dlvsym")


@pytest.mark.parametrize("kind", list(ESCAPES))
def test_an_escape_from_the_share_is_reported_within_5_s(
    reporting: Daemon, dlvsym_prog: Path, tmp_path: Path, kind: str
) -> None:
    command = escape_command(kind, tmp_path / "scratch", dlvsym_prog)
    job_id = reporting.submit(command, memory=SHARE, compute=10)
    escaped = wait_for_line(job_stdout(reporting, job_id), f"{ESCAPE_MIB} MiB")
    assert "could not hold" not in job_stdout(reporting, job_id)(), "the escape did not work"
    event = wait_for_job_event(reporting, job_id, "over_share")
    assert event["at"] - escaped <= REPORT_WITHIN_S
    assert "GPU 0: 2.5GiB in the driver, share and context reserve 2GiB" in event["detail"]
    time.sleep(2.5)  # two more passes: still one event, and nothing killed under `report`
    events = reporting.call("GET", "/v1/events")["events"]
    assert [e["kind"] for e in events if e["job_id"] == job_id] == ["over_share"]
    assert reporting.job(job_id)["state"] == "running"
    listed = cli("ps", url=reporting.url, check=True).stdout
    assert "running over-share" in listed
    described = cli("describe", str(job_id), url=reporting.url, check=True).stdout
    assert "watchdog: the driver saw it over its memory share" in described
    assert "over_share (GPU 0: 2.5GiB in the driver" in described


@pytest.mark.parametrize("kind", list(ESCAPES))
def test_an_escape_is_killed_and_the_kill_recorded(
    killing: Daemon, dlvsym_prog: Path, tmp_path: Path, kind: str
) -> None:
    command = escape_command(kind, tmp_path / "scratch", dlvsym_prog)
    job_id = killing.submit(command, memory=SHARE, compute=10)
    escaped = wait_for_line(job_stdout(killing, job_id), f"{ESCAPE_MIB} MiB")
    found = wait_for_job_event(killing, job_id, "over_share")
    assert found["at"] - escaped <= REPORT_WITHIN_S
    offenders = pids_in(found["detail"])
    assert len(offenders) == 2  # the driver cannot tell which one escaped: both go
    for pid in offenders:
        killed = wait_for_event(
            killing,
            lambda e, pid=pid: (
                e["kind"] == "watchdog_kill" and e["detail"].startswith(f"pid {pid}:")
            ),
        )
        assert killed["job_id"] == job_id
        assert killed["detail"] == f"pid {pid}: killed with SIGKILL"
    # the job's shell sees both die at once, not after their 60 s
    assert killing.wait(job_id, timeout=10)["state"] in ("succeeded", "failed")
    assert all(wait_gone(pid) for pid in offenders)


def test_a_process_the_daemon_did_not_start_is_reported(reporting: Daemon) -> None:
    foreign = foreign_process(reporting.node_dir)
    try:
        assert foreign.stdout is not None
        line = foreign.stdout.readline()
        seen = time.time()
        assert line.startswith(f"holding {ESCAPE_MIB} MiB")
        event = wait_for_event(reporting, lambda e: e["kind"] == "no_job")
        assert event["at"] - seen <= REPORT_WITHIN_S
        assert event["pid"] == foreign.pid and event["gpu"] == 0 and event["job_id"] is None
        assert "belongs to no job, 1GiB" in event["detail"]
        time.sleep(2.5)
        assert [e["kind"] for e in reporting.call("GET", "/v1/events")["events"]] == ["no_job"]
        assert foreign.poll() is None  # reported, not killed
        shown = cli("events", url=reporting.url, check=True).stdout
        assert "watchdog action: report" in shown
        assert f"node      no_job         GPU 0: pid {foreign.pid}" in shown
        for bad in (("--limit", "0"), ("--since", "-1")):
            refused = cli("events", *bad, url=reporting.url)
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    finally:
        foreign.kill()
        foreign.wait()


def test_a_process_the_daemon_did_not_start_is_killed(killing: Daemon) -> None:
    foreign = foreign_process(killing.node_dir)
    try:
        assert foreign.wait(timeout=20) == -9
        kill = wait_for_event(killing, lambda e: e["kind"] == "watchdog_kill")
        assert kill["pid"] == foreign.pid
        assert kill["detail"] == f"pid {foreign.pid}: killed with SIGKILL"
    finally:
        if foreign.poll() is None:
            foreign.kill()
            foreign.wait()


def test_a_process_that_left_its_job_by_a_double_fork_is_of_no_job(reporting: Daemon) -> None:
    # setsid -f: a new session, re-parented to init once the job's shell exits: no tie is left
    job_id = reporting.submit(
        ["setsid", "-f", sys.executable, CUDA_JOB, "20", str(ESCAPE_MIB)], memory=SHARE
    )
    event = wait_for_event(reporting, lambda e: e["kind"] == "no_job")
    try:
        assert reporting.job(job_id)["state"] == "succeeded"
        assert "belongs to no job, 1GiB" in event["detail"]
    finally:
        os.kill(event["pid"], signal.SIGKILL)


def test_a_job_within_its_share_raises_nothing(reporting: Daemon) -> None:
    # the same two processes without an escape: the shared region holds the share, the second
    # allocation is refused, and the driver's view stays within it
    python, job = sys.executable, CUDA_JOB
    script = f"{python} {job} 4 {HELD_MIB} & {python} {job} 4 {ESCAPE_MIB} & wait"
    job_id = reporting.submit(["sh", "-c", script], memory=SHARE, compute=10)
    wait_for_line(job_stdout(reporting, job_id), "could not hold")
    # a process that leaves the job's process group stays the job's (by its session)
    moved = reporting.submit(
        [
            sys.executable,
            "-c",
            f"import os; os.setpgid(0, 0); os.execv({python!r}, [{python!r}, {job!r}, '4', '256'])",
        ],
        memory="1Gi",
        compute=10,
    )
    wait_for_line(job_stdout(reporting, moved), "holding 256 MiB")
    time.sleep(2.5)
    assert reporting.call("GET", "/v1/events")["events"] == []
    marks = reporting.call("GET", "/v1/processes")["processes"]
    assert {(p["job"], p["share"], p["over_share"]) for p in marks} == {
        (job_id, 2 << 30, False),
        (moved, 1 << 30, False),
    }
    assert "over-share" not in cli("ps", url=reporting.url, check=True).stdout


def test_killing_a_process_that_has_exited_says_so_and_raises_nothing() -> None:
    done = subprocess.Popen(["true"])
    start = process_start_time(done.pid)
    assert start is not None
    done.wait()
    assert kill(done.pid, start) == "it had already exited"
    alive = subprocess.Popen(["sleep", "30"])
    try:
        # the same pid with another start time is another process: never signalled
        assert kill(alive.pid, 1) == "it had already exited"
        assert alive.poll() is None
        started = process_start_time(alive.pid)
        assert started is not None
        assert kill(alive.pid, started) == "killed with SIGKILL"
        assert alive.wait(timeout=10) == -signal.SIGKILL
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--watchdog", "shoot"], {}, "invalid watchdog action 'shoot'"),
        ([], {"GPUPOOL_WATCHDOG": "x"}, "invalid watchdog action 'x'"),
        (["--watchdog-exempt", "/bin/x,uid:abc"], {}, "invalid watchdog exemption 'uid:abc'"),
        ([], {"GPUPOOL_WATCHDOG_EXEMPT": "/bin/x,,uid:0"}, "invalid watchdog exemption '/bin/x,,"),
        (["--watchdog-exempt", "Xorg"], {}, "invalid watchdog exemption 'Xorg': name the exec"),
    ],
)
def test_a_bad_watchdog_setting_is_one_line_and_starts_nothing(
    tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    state = tmp_path / "state"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool",
            "serve",
            "--simulate",
            "1xA30",
            "--state-dir",
            str(state),
            *args,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpupool: error: {says}")
    paths = "use comma-separated absolute executable paths"
    use = "use report or kill" if "action" in says else paths
    assert use in result.stderr and result.stderr.count("\n") == 1
    assert not state.exists()


def test_gpus_marks_each_process_with_its_job_and_share(
    reporting: Daemon, dlvsym_prog: Path, tmp_path: Path
) -> None:
    foreign = foreign_process(reporting.node_dir)
    try:
        escaping = reporting.submit(
            escape_command("unset LD_PRELOAD", tmp_path / "scratch", dlvsym_prog),
            memory=SHARE,
            compute=10,
        )
        within = reporting.submit([sys.executable, CUDA_JOB, "60", "256"], memory="1Gi", compute=10)
        wait_for_event(reporting, lambda e: e["kind"] == "over_share")
        wait_for_event(reporting, lambda e: e["kind"] == "no_job")
        wait_for_line(job_stdout(reporting, within), "holding 256 MiB")
        time.sleep(1.5)  # a pass that has seen the last one too
        shown = cli(
            "gpus", "--node-dir", str(reporting.node_dir), url=reporting.url, check=True
        ).stdout
        rows = {line.split()[1]: line.rstrip() for line in shown.splitlines() if "python" in line}
        assert rows[str(foreign.pid)].endswith("no job")
        marks = sorted(line.split("  ")[-1].strip() for line in rows.values())
        assert marks == [
            f"job {escaping}, over 2GiB share",
            f"job {escaping}, over 2GiB share",
            f"job {within}, 1GiB share",
            "no job",
        ]
    finally:
        foreign.kill()
        foreign.wait()


def test_gpus_without_a_daemon_shows_no_marks_and_says_why(tmp_path: Path) -> None:
    node = tmp_path / "node"
    args = ("gpus", "--simulate", "1xA30", "--node-dir", str(node))
    nowhere = f"unix://{tmp_path / 'none.sock'}"
    assert "no job marks" not in cli(*args, url=nowhere, check=True).stdout  # nothing to mark
    foreign = foreign_process(node)
    try:
        assert foreign.stdout is not None and foreign.stdout.readline().startswith("holding")
        shown = cli(*args, url=nowhere, check=True).stdout
        assert f"no job marks: no gpupool daemon at {nowhere}" in " ".join(shown.split())
        assert "Job" not in shown.split("Processes")[1]
    finally:
        foreign.kill()
        foreign.wait()


def _metric(daemon: Daemon, name: str) -> dict[str, float]:
    """`name`'s samples in one scrape of /metrics, by their label values joined with ','."""
    return {",".join(labels.values()): value for labels, value in scrape(daemon).get(name, [])}


def test_the_metrics_and_the_dashboard_show_what_the_watchdog_found(
    reporting: Daemon, dlvsym_prog: Path, tmp_path: Path
) -> None:
    command = escape_command("unset LD_PRELOAD", tmp_path / "scratch", dlvsym_prog)
    job_id = reporting.submit(command, memory=SHARE, compute=10, name="leaky")
    foreign = foreign_process(reporting.node_dir)
    try:
        wait_for_job_event(reporting, job_id, "over_share")
        wait_for_event(reporting, lambda e: e["kind"] == "no_job")
        over = _metric(reporting, "gpupool_job_over_share")
        assert over == {f"{job_id},leaky,{pwd.getpwuid(os.getuid()).pw_name}": 1.0}, over
        assert _metric(reporting, "gpupool_gpu_processes_without_job") == {"0": 1.0}
        events = reporting.call("GET", "/v1/dashboard")["events"]
        kinds = {(e["kind"], e["job_id"]) for e in events}
        assert {("over_share", job_id), ("no_job", None)} <= kinds
    finally:
        foreign.kill()
        foreign.wait()


def test_a_graphics_only_process_is_neither_reported_nor_killed(killing: Daemon) -> None:
    display = graphics_process(killing.node_dir)  # a display server: graphics, of no job
    foreign = foreign_process(killing.node_dir)
    try:
        assert foreign.wait(timeout=20) == -9  # a pass has seen both by now
        time.sleep(2.5)  # two more passes
        assert display.poll() is None
        events = killing.call("GET", "/v1/events")["events"]
        assert {e["pid"] for e in events} == {foreign.pid}
        listed = killing.call("GET", "/v1/processes")["processes"]
        shown = [(p["pid"], p["kind"], p["job"], p["exempt"]) for p in listed]
        assert shown == [(display.pid, "graphics", None, None)]
        assert _metric(killing, "gpupool_gpu_processes_without_job") == {"0": 0.0}
        marks = cli("gpus", "--node-dir", str(killing.node_dir), url=killing.url, check=True)
        row = next(line for line in marks.stdout.splitlines() if str(display.pid) in line)
        assert row.rstrip().endswith("no job, graphics")
    finally:
        display.kill()
        display.wait()
        if foreign.poll() is None:
            foreign.kill()
            foreign.wait()


@pytest.mark.parametrize("by", ["path", "uid"])
def test_an_exempt_process_is_reported_once_and_never_killed(tmp_path: Path, by: str) -> None:
    # by executable through the option, by uid through the setting: both ways in
    path = os.path.realpath(sys.executable)  # what the CUDA program of foreign_process runs
    extra: tuple[str, ...] = ("--watchdog", "kill")
    env = {}
    if by == "path":
        extra += ("--watchdog-exempt", f"/usr/lib/xorg/Xorg,{sys.executable}")
    else:
        env["GPUPOOL_WATCHDOG_EXEMPT"] = f"uid:{os.getuid()}"
    daemon = Daemon(tmp_path, "1xA30", extra, env).start()
    foreign = foreign_process(daemon.node_dir)
    try:
        event = wait_for_event(daemon, lambda e: e["kind"] == "exempt")
        why = f"path {path}" if by == "path" else f"uid {os.getuid()}"
        assert event["pid"] == foreign.pid and event["job_id"] is None
        assert event["detail"].endswith(f"belongs to no job, 1GiB; exempt ({why}), not killed")
        time.sleep(2.5)
        assert foreign.poll() is None
        assert [e["kind"] for e in daemon.call("GET", "/v1/events")["events"]] == ["exempt"]
        shown = cli("events", url=daemon.url, check=True).stdout
        assert f"node      exempt         GPU 0: pid {foreign.pid}" in shown
        assert _metric(daemon, "gpupool_gpu_processes_without_job") == {"0": 0.0}
    finally:
        foreign.kill()
        foreign.wait()
        daemon.stop()
        _kill_jobs(daemon)
