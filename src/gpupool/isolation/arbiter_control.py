"""The trusted compute arbiter's control channel: register a share, change its weight, and find
or start the arbiter (native/arbiterd) of a node or of one user.

Only root and the arbiter's own user reach the control socket (0600 in a directory nobody else
can write, and the arbiter checks SO_PEERCRED too). The node daemon registers every share it
launches; `gpupool exec` registers its own share with the arbiter of its user (root's is the
node's). docs/protocols/arbiter.md describes the messages.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import socket
import stat
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import ConfigError, DeviceError
from gpupool.isolation.arbiter import CONTROL, uuid_bytes
from gpupool.isolation.libraries import arbiterd_program

MSG = struct.Struct("<IIQQQ16s")  # kind, arg, share_id, key, value, uuid
REGISTER, UNREGISTER, WEIGHT, OK, REFUSED = 16, 17, 18, 32, 34
#: a share any user's process may join (a Kubernetes pod: its container's uid is its image's)
ANY_UID = 0xFFFFFFFF
_WHY = {
    1: "no such share",
    2: "the share is registered with another key",
    3: "no slot left on the GPU",
    4: "a malformed request",
}
_PRIORITIES = {None: 0, "high": 1, "low": 2}
_POLICIES = {"cap": 0, "share": 1}
#: the lease lengths a share may register, in microseconds (gpupool_arbiter.h's
#: GPUPOOL_ARB_SLICE_MIN_US/MAX_US); 0: the arbiter's batch window (20 ms)
SLICE_MIN_US, SLICE_MAX_US = 100, 1_000_000
#: where the node's arbiter lives on a real node (root's); a simulated node keeps its own
NODE_DIR = Path("/run/gpupool/arbiter")
_START_TIMEOUT_S = 5.0
#: an arbiter exits this long after its last share and connection went (the daemon keeps a
#: connection open; a later launch starts it again)
IDLE_EXIT_S = 10


@dataclass(frozen=True)
class ArbiterShare:
    """A share's name at the arbiter: its id (shown) and key (only its processes get it)."""

    share_id: int
    key: int

    @classmethod
    def new(cls) -> ArbiterShare:
        return cls(secrets.randbits(63) + 1, secrets.randbits(64))

    @property
    def setting(self) -> str:
        """GPUPOOL_ARBITER_SHARE's value."""
        return f"{self.share_id:016x}:{self.key:016x}"


@dataclass(frozen=True)
class Registration:
    """What the arbiter holds a share to on its GPUs."""

    share: ArbiterShare
    uid: int
    gpu_uuids: tuple[str, ...]
    percent: int
    priority: str | None = None
    policy: str = "cap"
    #: its lease length next to busy shares of its class, in microseconds (0: the batch window)
    slice_us: int = 0


def _path_of(directory: Path) -> tuple[int, str]:
    """A descriptor of `directory` and a socket path through it: any length, never a link."""
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return fd, f"/proc/self/fd/{fd}/{CONTROL}"


class ArbiterControl:
    """One control connection to the arbiter in `directory`; the daemon keeps one open, and the
    shares it registered stay while it is (and after, while their processes run)."""

    def __init__(self, directory: Path, timeout_s: float = 5.0) -> None:
        self.directory = directory
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(timeout_s)
        try:
            fd, path = _path_of(directory)
            try:
                self.sock.connect(path)
            finally:
                os.close(fd)
        except OSError as err:
            self.sock.close()
            raise DeviceError(f"cannot reach the compute arbiter in {directory}: {err}") from err

    def close(self) -> None:
        self.sock.close()

    def alive(self) -> bool:
        """Whether the arbiter is still at the other end (it never speaks unasked: any
        readable end of the connection is its close)."""
        timeout = self.sock.gettimeout()
        self.sock.settimeout(0.0)  # a timeout would make Python wait for data
        try:
            return self.sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            self.sock.settimeout(timeout)

    def _ask(
        self,
        kind: int,
        share_id: int,
        key: int = 0,
        arg: int = 0,
        value: int = 0,
        uuid: bytes = b"\0" * 16,
    ) -> int:
        try:
            self.sock.send(MSG.pack(kind, arg, share_id, key, value, uuid))
            answer = self.sock.recv(MSG.size)
        except OSError as err:
            raise DeviceError(f"the compute arbiter in {self.directory} failed: {err}") from err
        if len(answer) != MSG.size:
            raise DeviceError(f"the compute arbiter in {self.directory} closed the connection")
        got, why = MSG.unpack(answer)[:2]
        why = int(why)
        if got != OK:
            raise DeviceError(
                f"the compute arbiter refused share {share_id:016x}: {_WHY.get(why, why)}"
            )
        return why

    def register(self, registration: Registration) -> None:
        """Hold the share to its terms on each of its GPUs (again: the same terms, updated)."""
        if not 1 <= registration.percent <= 100:
            raise ConfigError(f"a compute share of {registration.percent}% cannot be arbitrated")
        slice_us = registration.slice_us
        if slice_us != 0 and not SLICE_MIN_US <= slice_us <= SLICE_MAX_US:
            raise ConfigError(
                f"a time slice of {slice_us} us cannot be arbitrated: "
                f"{SLICE_MIN_US} us to {SLICE_MAX_US // 1000} ms"
            )
        terms = (
            registration.percent
            | _PRIORITIES[registration.priority] << 8
            | _POLICIES[registration.policy] << 16
            | slice_us << 32
        )
        share = registration.share
        for gpu in registration.gpu_uuids:
            self._ask(REGISTER, share.share_id, share.key, registration.uid, terms, uuid_bytes(gpu))

    def unregister(self, share_id: int) -> None:
        """Drop the share (its running processes keep their slot until they end)."""
        self._ask(UNREGISTER, share_id)

    def set_weight(self, share_id: int, percent: int) -> None:
        """Change a registered share's weight (its compute percent) on all its GPUs, at once."""
        if not 1 <= percent <= 100:
            raise ConfigError(f"a compute share of {percent}% cannot be arbitrated")
        self._ask(WEIGHT, share_id, value=percent)


def set_share_weight(directory: Path, share_id: int, percent: int) -> None:
    """Resize a running share's compute: its weight at the arbiter in `directory` becomes
    `percent`, on every GPU it holds (DeviceError if the arbiter does not know it)."""
    control = ArbiterControl(directory)
    try:
        control.set_weight(share_id, percent)
    finally:
        control.close()


# ---- where the arbiter lives, and starting it ----------------------------------------------


def _node_key(sim_node: Path | None) -> str:
    if sim_node is None:
        return "node"
    return "sim-" + hashlib.sha256(str(sim_node.resolve()).encode()).hexdigest()[:12]


def private_arbiter_dir(sim_node: Path | None) -> Path:
    """A user's own arbiter of the node, for `gpupool exec` without the daemon: in the user's
    runtime directory (XDG_RUNTIME_DIR, else /tmp/gpupool-UID)."""
    uid = os.geteuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "gpupool" if runtime else Path(f"/tmp/gpupool-{uid}")
    return base / f"arbiter-{_node_key(sim_node)}"


def node_arbiter_dir(sim_node: Path | None) -> Path:
    """The node's arbiter, root's: every host share and pod of the node (a simulated node's
    directory holds its own). Another user's launches go to that user's own arbiter."""
    if os.geteuid() != 0:
        return private_arbiter_dir(sim_node)
    return sim_node / "arbiter" if sim_node is not None else NODE_DIR


def _own_dir(path: Path, mode: int) -> None:
    """`path` as a directory of ours that nobody else can write; made if missing."""
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # past the umask
    except FileExistsError:
        pass
    except OSError as err:
        raise ConfigError(f"cannot make the compute arbiter's directory {path}: {err}") from err
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
        raise ConfigError(
            f"{path} is not a directory of uid {os.geteuid()} that nobody else can write: remove it"
        )


def prepare_dir(directory: Path, private: bool = False) -> None:
    """The arbiter's directory (0755: every user connects and reads the views); a private one's
    parent is the user's own (0700)."""
    if private:
        directory.parent.parent.mkdir(parents=True, exist_ok=True)
        _own_dir(directory.parent, 0o700)
    else:
        directory.parent.mkdir(parents=True, exist_ok=True)
    _own_dir(directory, 0o755)


def start_arbiter(directory: Path, log: Path | None, idle_exit_s: int | None = IDLE_EXIT_S) -> int:
    """Start the arbiter in `directory`, in its own session (it outlives whoever started it,
    as the jobs do); its pid once its control socket answers."""
    argv = [str(arbiterd_program()), str(directory)]
    if idle_exit_s is not None:
        argv += ["--idle-exit", str(idle_exit_s)]
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        out = os.open(log, flags, 0o600) if log is not None else subprocess.DEVNULL
    except OSError as err:
        raise ConfigError(f"cannot open the compute arbiter's log {log}: {err.strerror}") from err
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,
        )
    finally:
        if log is not None:
            os.close(out)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DeviceError(f"the compute arbiter in {directory} exited at start")
        try:
            ArbiterControl(directory, timeout_s=1.0).close()
            return process.pid
        except DeviceError:
            time.sleep(0.02)
    process.kill()
    raise DeviceError(f"the compute arbiter in {directory} did not start")


def ensure_arbiter(
    directory: Path,
    log: Path | None = None,
    idle_exit_s: int | None = IDLE_EXIT_S,
    private: bool = False,
) -> ArbiterControl:
    """A control connection to the arbiter in `directory`, started first if none answers (one
    starter at a time: a lock file in the directory)."""
    try:
        return ArbiterControl(directory)
    except DeviceError:
        pass
    prepare_dir(directory, private)
    lock = os.open(
        directory / "start.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return ArbiterControl(directory)
        except DeviceError:
            start_arbiter(directory, log, idle_exit_s)
        return ArbiterControl(directory)
    finally:
        os.close(lock)
