"""An exemption cannot be claimed from another mount namespace (issue 35, item 2): a user outside
the socket group, with unprivileged user and mount namespaces, bind-mounts a CUDA program over
an exempted path in a namespace of their own, where its /proc/PID/exe reads that path. Under
`--watchdog kill` it is killed as a process of no job, not reported as exempt. And in the host's
own namespace, another file mounted over the exempted path exempts nothing either."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import CUDA_JOB, Daemon
from tests.agent.watchdog_support import ESCAPE_MIB, wait_for_event
from tests.users import User, check_interpreter, remove_tree, user_env, users, world_dir

from gpupool.agent.exempt import executable
from gpupool.isolation.libraries import native_libraries

PYTHON = os.path.realpath(sys.executable)
#: a user and mount namespace of one's own, as an unprivileged user may make one
UNSHARE = ("unshare", "--user", "--map-root-user", "--mount")


def _userns_refused() -> str | None:
    """Why an ordinary user cannot make user and mount namespaces here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this host"
    with users(1) as (user,):
        done = subprocess.run(
            [*UNSHARE, "true"],
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
        )
    if done.returncode != 0:
        return f"the kernel refuses unprivileged user namespaces: {done.stderr.strip()}"
    return None


@pytest.fixture
def exempting(tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    """A killing daemon, in a directory every user may enter, that exempts its `Xorg` (root's
    copy of a program, as /usr/lib/xorg/Xorg is)."""
    root = world_dir()
    xorg = root / "Xorg"
    shutil.copy2("/bin/true", xorg)
    daemon = Daemon(root, "1xA30", ("--watchdog", "kill", "--watchdog-exempt", str(xorg)))
    try:
        yield daemon.start(), xorg
    finally:
        daemon.stop()
        _kill_jobs(daemon)
        remove_tree(root)


def _in_own_namespace(user: User, node_dir: Path, over: Path) -> subprocess.Popen[str]:
    """`user` (in no group of the daemon's) runs the CUDA program as `over`, bind-mounted there
    in a user and mount namespace of their own."""
    script = f'mount --bind "$1" "$2" && exec "$2" "$3" 60 {ESCAPE_MIB}'
    env = user_env(user, {"LD_LIBRARY_PATH": str(native_libraries().sim_dir)})
    env["GPUPOOL_SIM_NODE"] = str(node_dir)
    return subprocess.Popen(
        [*UNSHARE, "sh", "-c", script, "sh", PYTHON, str(over), CUDA_JOB],
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env=env,
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_program_mounted_over_an_exempt_path_in_a_user_namespace_is_killed(
    exempting: tuple[Daemon, Path],
) -> None:
    refused = _userns_refused()
    if refused:
        pytest.skip(refused)
    daemon, xorg = exempting
    with users(1) as (outsider,):
        check_interpreter(outsider)
        program = _in_own_namespace(outsider, daemon.node_dir, xorg)
        try:
            event = wait_for_event(daemon, lambda e: e["pid"] == program.pid, timeout=20)
            assert event["kind"] == "no_job", event
            assert program.wait(timeout=20) == -9, program.stdout and program.stdout.read()
            events = daemon.call("GET", "/v1/events")["events"]
            kinds = {e["kind"] for e in events if e["pid"] == program.pid}
            assert kinds == {"no_job", "watchdog_kill"}
        finally:
            if program.poll() is None:
                program.kill()
                program.wait()


def test_another_file_mounted_over_an_exempt_path_on_the_host_exempts_nothing(
    tmp_path: Path,
) -> None:
    exempt = tmp_path / "agent"
    shutil.copy2(shutil.which("sleep") or "/bin/sleep", exempt)
    sleeper = subprocess.Popen([str(exempt), "30"])
    try:
        time.sleep(0.2)
        assert executable(sleeper.pid) == str(exempt)  # the host's file, in the host's mounts
        other = tmp_path / "other"
        shutil.copy2("/bin/true", other)
        if subprocess.run(["mount", "--bind", str(other), str(exempt)]).returncode != 0:
            pytest.skip("cannot bind-mount here (no CAP_SYS_ADMIN)")
        try:
            # the process still reads as running `exempt`, but that path is another file now
            assert os.readlink(f"/proc/{sleeper.pid}/exe") == str(exempt)
            assert executable(sleeper.pid) is None
        finally:
            subprocess.run(["umount", str(exempt)], check=True)
    finally:
        sleeper.kill()
        sleeper.wait()
