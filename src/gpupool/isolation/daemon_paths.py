"""Where a node's daemon keeps its state and its socket by default.

Both the daemon (`gpupool serve`) and its client need these names, so they sit below both: the
client finds the socket without importing the daemon's machinery (agent/), which keeps a client
command's start short. Checking and holding the state dir is the daemon's (agent/statedir.py).
"""

from __future__ import annotations

import os
from pathlib import Path

SOCKET_NAME = "gpupool.sock"
SYSTEM_STATE_DIR = Path("/var/lib/gpupool")


def default_state_dir() -> Path:
    """/var/lib/gpupool as root, else $XDG_STATE_HOME/gpupool (~/.local/state/gpupool)."""
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "gpupool"


def default_socket() -> Path:
    """The socket of the daemon that serves the default state dir."""
    return default_state_dir() / SOCKET_NAME
