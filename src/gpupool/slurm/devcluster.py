"""`gpupool slurm dev-cluster`: a Slurm cluster on this machine wired to gpupool, for the tests,
the demo and a newcomer.

munged, slurmctld and slurmd (Debian's packages) on localhost with their own key, config, state,
logs and ports under DIR; a `gpupool serve` on a simulated node under DIR as the node's agent;
gres.conf with `Name=gpu` and `Name=shard` for its GPUs; the Prolog and Epilog that make and end
each job's share, and the SPANK plugin that holds each task to it. Nothing on the host changes:
the config is DIR/slurm.conf (SLURM_CONF in DIR/env), the plugin puts a job's files over /etc in
the task's own mount namespace. One node: Debian's Slurm runs one slurmd per host.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gpupool.core.errors import ConfigError, InvalidRequest
from gpupool.devices.factory import open_backend
from gpupool.isolation.libraries import NATIVE_DIR
from gpupool.slurm.shares import node_gpus

NODE = "gpupool0"
SPANK_PLUGIN = "gpupool-spank.so"
#: seconds the cluster has to come up
UP_TIMEOUT_S = 60.0
PROGRAMS = ("munged", "slurmctld", "slurmd", "scontrol", "srun")
#: what `down` stops, in this order (their pid files under DIR)
PIDS = ("slurmd.pid", "slurmctld.pid", "munge/munged.pid", "gpupool.pid")


def _require_programs() -> None:
    import shutil

    path = f"{os.environ.get('PATH', '')}:/usr/sbin"
    missing = [p for p in PROGRAMS if shutil.which(p, path=path) is None]
    if missing:
        raise ConfigError(
            f"the dev cluster needs Slurm and munge ({', '.join(missing)} missing): "
            "`make slurm` as root, or apt-get install slurmctld slurmd slurm-client munge"
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _slurm_conf(root: Path, gpus: int, shards: int) -> str:
    host = socket.gethostname().split(".")[0]
    gres = f"gpu:{gpus},shard:{gpus * shards}"
    lines = {
        "ClusterName": "gpupooldev",
        "SlurmctldHost": f"{host}(127.0.0.1)",
        "SlurmctldPort": str(_free_port()),
        "SlurmdPort": str(_free_port()),
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "AuthInfo": f"socket={root}/munge/munge.sock",
        "CredType": "cred/munge",
        "StateSaveLocation": f"{root}/ctld",
        "SlurmdSpoolDir": f"{root}/spool",
        "SlurmctldPidFile": f"{root}/slurmctld.pid",
        "SlurmdPidFile": f"{root}/slurmd.pid",
        "SlurmctldLogFile": f"{root}/log/slurmctld.log",
        "SlurmdLogFile": f"{root}/log/slurmd.log",
        # no cgroups in a container: Slurm follows a job's processes by their parents
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core",
        "GresTypes": "gpu,shard",
        "SlurmdParameters": "config_overrides",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "MpiDefault": "none",
        "ReturnToService": "2",
        "SchedulerParameters": "sched_interval=1",
        "KillWait": "2",
        "PlugStackConfig": f"{root}/plugstack.conf",
        "Prolog": f"{root}/prolog",
        "Epilog": f"{root}/epilog",
    }
    text = "".join(f"{k}={v}\n" for k, v in lines.items())
    text += (
        f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=64 Gres={gres} "
        "State=UNKNOWN\nPartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
    )
    return text


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    os.chmod(path, mode)


def write_config(root: Path, gpus: int, shards: int) -> None:
    """slurm.conf, gres.conf, plugstack.conf, the Prolog and Epilog, and DIR/env."""
    for sub in ("ctld", "spool", "log", "dev", "shares"):
        (root / sub).mkdir(mode=0o711, exist_ok=True)
    _write(root / "slurm.conf", _slurm_conf(root, gpus, shards))
    gres = [f"NodeName={NODE} Name=gpu File={root}/dev/nvidia{i}\n" for i in range(gpus)]
    for i in range(gpus):
        (root / "dev" / f"nvidia{i}").touch()
    gres.append(f"NodeName={NODE} Name=shard Count={gpus * shards}\n")
    _write(root / "gres.conf", "".join(gres))
    spank = NATIVE_DIR / SPANK_PLUGIN
    if not spank.exists():
        raise ConfigError(f"no {spank}: install libslurm-dev and run `make native`")
    _write(root / "plugstack.conf", f"required {spank} shares={root}/shares\n")
    flags = f"--url unix://{root}/state/gpupool.sock"
    for hook in ("prolog", "epilog"):
        _write(
            root / hook,
            f"#!/bin/sh\nexec {sys.executable} -m gpupool slurm {hook} {flags} "
            f"--shards {shards} >>{root}/log/{hook}.log 2>&1\n",
            0o755,
        )
    _write(
        root / "env",
        f"export SLURM_CONF={root}/slurm.conf\n"
        f"export GPUPOOL_URL=unix://{root}/state/gpupool.sock\n",
    )


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )


def _wait(what: str, ready: object, root: Path) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        if callable(ready) and ready():
            return
        time.sleep(0.2)
    raise ConfigError(f"the dev cluster's {what} did not come up: see {root}/log/")


def _answers(serve: subprocess.Popen[bytes], path: Path) -> bool:
    """Whether the daemon listens on `path`; ConfigError with its last line if it ended."""
    if serve.poll() is not None:
        lines = (path.parent.parent / "log" / "gpupool.log").read_text().splitlines()
        raise ConfigError(f"the dev cluster's gpupool daemon ended: {lines[-1] if lines else ''}")
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _node_idle(root: Path) -> bool:
    done = subprocess.run(
        ["scontrol", "show", "node", NODE],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": str(root / "slurm.conf")},
        check=False,
    )
    return "State=IDLE" in done.stdout


def _start_munge(root: Path) -> None:
    munge = root / "munge"
    munge.mkdir(mode=0o700, exist_ok=True)
    key = munge / "munge.key"
    if not key.exists():
        _write(key, os.urandom(1024).hex(), 0o400)
    subprocess.run(
        ["munged", "--force", f"--socket={munge}/munge.sock", f"--key-file={key}",
         f"--pid-file={munge}/munged.pid", f"--log-file={root}/log/munged.log",
         f"--seed-file={munge}/seed"],
        check=True, capture_output=True,
    )  # fmt: skip
    os.chmod(munge, 0o711)  # every user's srun reaches the socket


def up(root: Path, simulate: str, shards: int, nodes: int = 1) -> None:
    """Start the cluster in `root` (made if missing) on a simulated node of spec `simulate`."""
    if nodes != 1:
        raise InvalidRequest(f"--nodes {nodes}: Debian's Slurm runs one slurmd per host: use 1")
    if not 1 <= shards <= 1000:
        raise InvalidRequest(f"--shards {shards}: from 1 to 1000 shards per GPU")
    _require_programs()
    root = root.resolve()
    if (root / "gpupool.pid").exists():
        raise InvalidRequest(f"a dev cluster runs in {root} already: `down` it first")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    (root / "log").mkdir(mode=0o711, exist_ok=True)
    serve = _start(
        [sys.executable, "-m", "gpupool", "serve", "--simulate", simulate,
         "--state-dir", str(root / "state"), "--node-dir", str(root / "node"),
         "--slurm-shares", str(root / "shares")],
        root / "log" / "gpupool.log",
    )  # fmt: skip
    _write(root / "gpupool.pid", f"{serve.pid}\n")
    _wait("gpupool daemon", lambda: _answers(serve, root / "state" / "gpupool.sock"), root)
    gpus = len(node_gpus(open_backend(None, root / "node").snapshot()))
    write_config(root, gpus, shards)
    _start_munge(root)
    conf = str(root / "slurm.conf")
    subprocess.run(["slurmctld", "-f", conf, "-i"], check=True, capture_output=True)
    subprocess.run(["slurmd", "-f", conf, "-N", NODE], check=True, capture_output=True)
    _wait("slurmd", lambda: _node_idle(root), root)


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def down(root: Path) -> list[str]:
    """Cancel every job, stop what `up` started; what was stopped."""
    root = root.resolve()
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    _cancel_all(env)
    stopped = []
    for name in PIDS:
        pid = _pid(root / name)
        if pid is None:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            _wait_gone(pid)
            stopped.append(name.split("/")[-1].removesuffix(".pid"))
        with contextlib.suppress(OSError):
            (root / name).unlink()
    return stopped


def _cancel_all(env: dict[str, str], seconds: float = 20.0) -> None:
    """Cancel every job and wait (bounded) until Slurm lists none: their processes end and
    their Epilogs run before the daemons stop."""
    deadline = time.monotonic() + seconds
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["scancel", "--partition=debug"], env=env, capture_output=True, timeout=10)
        while time.monotonic() < deadline:
            listed = subprocess.run(
                ["squeue", "-h"], env=env, capture_output=True, text=True, timeout=10
            )
            if listed.returncode != 0 or not listed.stdout.strip():
                return
            time.sleep(0.2)


def _wait_gone(pid: int, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
