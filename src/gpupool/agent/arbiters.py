"""The node's trusted compute arbiter, kept by the daemon: found or started at start, started
again when it dies (every running job's share registered with it again), and each job's share
registered before the job starts.

A job's (or a pod's) name at the arbiter is derived from its id and a secret of the state
directory (HMAC), so a restarted daemon registers the shares of the jobs it re-adopts under the
names their processes already carry, with nothing stored per job.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gpupool.core.errors import ConfigError, GpupoolError
from gpupool.isolation.arbiter_control import (
    ArbiterControl,
    ArbiterShare,
    Registration,
    ensure_arbiter,
    set_share_weight,
)

log = logging.getLogger(__name__)

SECRET_NAME = "arbiter.secret"
LOG_NAME = "arbiter.log"


def _secret(state_dir: Path) -> bytes:
    """The state directory's arbiter secret (0600, the daemon's), made on first use."""
    path = state_dir / SECRET_NAME
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.write(fd, secrets.token_bytes(32))
        os.lseek(fd, 0, os.SEEK_SET)
    try:
        data = os.read(fd, 64)
    finally:
        os.close(fd)
    if len(data) != 32:
        raise ConfigError(f"{path} is not gpupool's arbiter secret: remove it")
    return data


class NodeArbiter:
    """The daemon's side of the node's arbiter in `directory`; thread-safe."""

    def __init__(self, directory: Path, state_dir: Path) -> None:
        self.directory = directory
        self.log = state_dir / LOG_NAME
        state_dir.mkdir(parents=True, exist_ok=True)
        self._secret = _secret(state_dir)
        self._control: ArbiterControl | None = None
        self._since = 0.0  # when the control connection was made (time.monotonic)
        self._lock = threading.Lock()
        #: the node's shares the daemon did not start (a Slurm node's jobs'), registered again
        #: with the daemon's own when the arbiter is started again
        self._others: list[Callable[[], Iterable[Registration]]] = []

    def also_keep(self, shares: Callable[[], Iterable[Registration]]) -> None:
        """Have `keep` register `shares`' registrations too after a restart of the arbiter."""
        with self._lock:
            self._others.append(shares)

    def share_of(self, name: str) -> ArbiterShare:
        """The share `name`'s ("job 12", "pod <uid>") id and key at the arbiter, the same for
        every daemon of this state dir."""
        digest = hmac.new(self._secret, name.encode(), hashlib.sha256).digest()
        share_id = int.from_bytes(digest[:8], "little") | 1  # never 0: a free slot
        return ArbiterShare(share_id, int.from_bytes(digest[8:16], "little"))

    def _connected(self) -> ArbiterControl:
        if self._control is not None and self._control.alive():
            return self._control
        if self._control is not None:
            self._control.close()
            self._control = None
            log.warning("the compute arbiter in %s went away: starting it again", self.directory)
        # a daemon not run as root serves its own user: its arbiter is that user's own
        private = os.geteuid() != 0
        self._control = ensure_arbiter(self.directory, self.log, private=private)
        self._since = time.monotonic()
        return self._control

    def up_for(self, seconds: float, now: float) -> bool:
        """Whether the arbiter has answered for at least `seconds` (its shares had time to
        join it)."""
        with self._lock:
            control = self._control
            return control is not None and now - self._since >= seconds and control.alive()

    def register(self, registration: Registration) -> None:
        """Hold a share to its terms before its job starts (DeviceError if the arbiter cannot)."""
        with self._lock:
            self._connected().register(registration)

    def unregister(self, share_id: int) -> None:
        """Drop a share whose job or pod is gone (its slot frees with its last process). An
        arbiter that went away took its shares along; the next one holds the running ones only,
        so none is started for this."""
        with self._lock:
            if self._control is not None and self._control.alive():
                self._control.unregister(share_id)

    def set_weight(self, share_id: int, percent: int) -> None:
        """Resize a running share's compute weight (see isolation's set_share_weight)."""
        set_share_weight(self.directory, share_id, percent)

    def set_job_weight(self, job_id: int, percent: int) -> None:
        """Resize job `job_id`'s compute weight at the arbiter, on all its GPUs (DeviceError if
        it is not registered: no compute limit nor priority, or not running). After a restart of
        the arbiter the job is registered again from its record: keep that in step."""
        self.set_weight(self.share_of(f"job {job_id}").share_id, percent)

    def keep(self, running: Callable[[], Iterable[Registration]]) -> None:
        """Check the arbiter is there; if it had to be started again, register every running
        share with it (its processes rejoin on their own within a second)."""
        with self._lock:
            if self._control is not None and self._control.alive():
                return
            try:
                control = self._connected()
            except GpupoolError as err:
                log.warning("no compute arbiter: %s (shares hold their caps alone)", err)
                return
            others = [registration for source in self._others for registration in source()]
            for registration in [*running(), *others]:
                try:
                    control.register(registration)
                except GpupoolError as err:
                    log.warning("share %016x: %s", registration.share.share_id, err)

    def close(self) -> None:
        """Let go of the control connection; the arbiter keeps running for the jobs."""
        with self._lock:
            if self._control is not None:
                self._control.close()
                self._control = None
