"""The one error hierarchy of gpupool; every layer maps outside failures onto it.

Each class carries the exit code the `gpupool` command uses when it reaches the user as one line
(`gpupool: error: ...`), with the cause chained for `GPUPOOL_DEBUG=1`, and the HTTP status the
daemon's API answers it with (`{"error": class name, "message": the line}`); the daemon's client
turns that answer back into the same class (`from_answer`), so a daemon-side error reaches the
user as itself. A subclass inherits both numbers unless it sets its own.

    class                      exit  HTTP  meaning
    GpupoolError                 1   500  base; never raised itself
    ├── InvalidRequest           2   400  a malformed or impossible request (size, name, range)
    │   ├── MigLayoutError       1   400  a MIG layout does not fit a GPU (`mig check` says "no")
    │   └── NotFound             2   404  the named thing (a job id) does not exist
    ├── ConfigError              2   500  an input file is malformed or unreadable; names the place
    │   └── TraceFormatError     2   500  a trace file; names file, line and column
    ├── Unschedulable            3   409  a request that can never fit, not even on an empty node
    ├── DeviceError              4   503  the GPU layer failed: NVML, the driver, a simulated node
    │   ├── DriverNotFound       4   503  no NVIDIA driver or NVML library on this machine
    │   ├── NotAvailable         4   503  the device does not support the asked function
    │   └── GpuLost              4   503  a GPU fell off the bus; the node's other GPUs answer
    ├── NativeLibraryError       5   500  a native library of gpupool is missing or cannot load
    ├── PermissionDenied         6   403  the caller may not do this (another user's job)
    │   └── Unauthorized         6   401  a TCP request without the daemon's bearer token
    ├── DaemonError              7   503  the daemon cannot be reached, or failed to answer
    │   └── StoreBusy            7   503  the daemon's state is locked by another process: retry
    │       └── StoreFull        7   503  the disk under the daemon's state is full: retry later
    └── KubeApiError             8   502  the Kubernetes API server failed or timed out

Outside the tree: a usage error (unknown option) exits 2, and a bug exits 70 ("internal error").
`gpupool exec` exits 125 for any failure of its own, as env(1) and timeout(1) do, so that it is
never taken for the command's own status; 126 and 127 are a command that cannot be run or found.
"""

from __future__ import annotations


class GpupoolError(Exception):
    """Base of every error gpupool raises on purpose; `str()` is the one line a user sees."""

    #: process exit code the CLI uses for this kind of error
    exit_code: int = 1
    #: HTTP status the daemon's API answers this kind of error with
    http_status: int = 500


class InvalidRequest(GpupoolError):
    """The caller asked for something malformed or impossible (a bad quantity, name, range)."""

    exit_code = 2
    http_status = 400


class ConfigError(GpupoolError):
    """A configuration or input file is malformed; the message names the file and the place."""

    exit_code = 2


class TraceFormatError(ConfigError):
    """A trace file is malformed or missing; the message names file, line and column."""


class Unschedulable(GpupoolError):
    """A request that can never fit: no node could hold it even with nothing else placed.

    A request that does not fit *now* waits (the scheduler answers None); this one never will, so
    the node daemon and the Kubernetes extender refuse it at once with this error.
    """

    exit_code = 3
    http_status = 409


class DeviceError(GpupoolError):
    """The GPU layer failed: NVML, the driver, a simulated node."""

    exit_code = 4
    http_status = 503


class DriverNotFound(DeviceError):
    """No NVIDIA driver (or NVML library) on this machine."""


class NotAvailable(DeviceError):
    """The device does not support the asked function (NVML NotSupported, missing symbol)."""


class GpuLost(DeviceError):
    """A GPU fell off the bus (NVML_ERROR_GPU_IS_LOST): that GPU is unhealthy, the others answer."""


class NativeLibraryError(GpupoolError):
    """A native library of gpupool is missing or cannot be loaded."""

    exit_code = 5


def not_utf8(source: str, err: UnicodeDecodeError) -> ConfigError:
    """The one line for an input file that is not UTF-8 text, naming the file and the line."""
    data = err.object if isinstance(err.object, bytes) else b""
    line = data[: err.start].count(b"\n") + 1
    return ConfigError(
        f"{source}:{line}: not UTF-8 text (byte {data[err.start : err.start + 1]!r})"
    )


class MigLayoutError(InvalidRequest):
    """A MIG layout does not fit a GPU (overlap, invalid start, too many instances)."""

    exit_code = 1


class NotFound(InvalidRequest):
    """The named thing (a job id) does not exist."""

    http_status = 404


class PermissionDenied(GpupoolError):
    """The caller may not do this (cancel another user's job, a request without its token)."""

    exit_code = 6
    http_status = 403


class Unauthorized(PermissionDenied):
    """A TCP request without the daemon's bearer token (or with a wrong one)."""

    http_status = 401


class DaemonError(GpupoolError):
    """The node daemon cannot be reached, refused to start, or answered with a failure."""

    exit_code = 7
    http_status = 503


class StoreBusy(DaemonError):
    """The daemon's state database is locked by another process (a backup, an admin's sqlite3):
    the request changed nothing and may be retried in a moment (the API answers 503 with
    Retry-After)."""


class StoreFull(StoreBusy):
    """The disk under the daemon's state database is full: the change was not made, and may be
    retried once space returns (a job's bookkeeping waits for it, no job is failed for it)."""


class KubeApiError(GpupoolError):
    """The Kubernetes API server failed or timed out; the cause from the client is chained."""

    exit_code = 8
    http_status = 502


def classes(root: type[GpupoolError] = GpupoolError) -> list[type[GpupoolError]]:
    """`root` and every subclass of it, shallow ones first (breadth-first)."""
    found: list[type[GpupoolError]] = []
    queue = [root]
    while queue:
        kind = queue.pop(0)
        found.append(kind)
        queue.extend(kind.__subclasses__())
    return found


def from_answer(name: str, status: int, message: str) -> GpupoolError:
    """The error a daemon's answer stands for (`{"error": name, "message": ...}` with `status`).

    The class of that name in the tree; for a name this side does not know (a daemon newer than
    its client), the one class that brings in `status` itself (the answer of its whole branch),
    else a DaemonError: the message reaches the user either way.
    """
    tree = classes()
    named = next((kind for kind in tree if kind.__name__ == name), None)
    if named is not None and named is not GpupoolError:
        return named(message)
    own = [kind for kind in tree[1:] if _brings_in(kind, status)]
    kind = own[0] if len(own) == 1 else DaemonError
    return kind(message)


def _brings_in(kind: type[GpupoolError], status: int) -> bool:
    """Whether `kind` answers `status` and its parent does not."""
    parent = kind.__bases__[0]
    inherited = issubclass(parent, GpupoolError) and parent.http_status == status
    return kind.http_status == status and not inherited
