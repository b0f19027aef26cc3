"""A simulated node directory's own files: node.json (the GPUs, their MIG modes and instances),
read whole, and node.lock, held while node.json is read, changed and replaced.

The node is its creator's (a root daemon's, for a shared one); every user's processes on the
simulated driver reach its state file, as every user opens a real node's /dev/nvidia* devices,
and anyone who may read the directory may look at it (`gpupool gpus`). Only its owner changes
it: another user cannot open the lock (0600), so they read node.json without it, which is safe
because node.json is only ever replaced whole (os.replace), never written in place.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpupool.core.errors import DeviceError

NODE_FILE = "node.json"
LOCK_FILE = "node.lock"
NODE_FORMAT = 1


def read_node_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise DeviceError(f"cannot read simulated node {path}: {err.strerror}") from err
    except json.JSONDecodeError as err:
        raise DeviceError(f"{path} is not a simulated node file: {err}") from err
    if not isinstance(data, dict) or data.get("format") != NODE_FORMAT:
        raise DeviceError(f"{path} is not a simulated node file of format {NODE_FORMAT}")
    return data


@contextlib.contextmanager
def locked(directory: Path, *, create: bool) -> Iterator[bool]:
    """Hold the node's lock file (node.json changes are read-modify-write); yields whether it
    is held: False for a user who may not open another user's lock, who may only read."""
    try:
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except PermissionError as err:
        if create or not (directory / NODE_FILE).exists():
            raise DeviceError(f"cannot use simulated node directory {directory}: {err}") from err
        yield False
        return
    except OSError as err:
        if not create and not directory.exists():
            raise DeviceError(
                f"no simulated node in {directory}: create one with --simulate SPEC "
                "(e.g. --simulate 2xA30)"
            ) from err
        raise DeviceError(f"cannot use simulated node directory {directory}: {err}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # closing releases the flock
