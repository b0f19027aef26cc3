"""The daemon's state directory: where it is, that it is writable, and that one daemon holds it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from gpupool.core.errors import ConfigError, DaemonError

SOCKET_NAME = "gpupool.sock"
LOCK_NAME = "daemon.lock"
SYSTEM_STATE_DIR = Path("/var/lib/gpupool")


def default_state_dir() -> Path:
    """/var/lib/gpupool as root, else $XDG_STATE_HOME/gpupool (~/.local/state/gpupool)."""
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "gpupool"


def prepare(state_dir: Path) -> Path:
    """Create `state_dir` (0755) if needed, or say in one line why it cannot be used."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as err:
        raise ConfigError(f"cannot create the state dir {state_dir}: {err.strerror}") from err
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"the state dir {state_dir} is not writable by this user")
    return state_dir.resolve()


def hold(state_dir: Path) -> IO[str]:
    """Lock `state_dir` for this daemon (kept until the returned file closes or we die)."""
    handle = (state_dir / LOCK_NAME).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise DaemonError(
            f"another gpupool daemon (pid {holder}) already serves {state_dir}"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle
