"""The one error hierarchy of gpupool; every layer maps outside failures onto it.

Each class carries the exit code the `gpupool` command uses when it reaches the user as one line
(`gpupool: error: ...`), with the cause chained for `GPUPOOL_DEBUG=1`:

    GpupoolError               1  base; never raised itself
    ├── InvalidRequest         2  a malformed or impossible request (size, name, range, index)
    │   └── MigLayoutError     1  a MIG layout does not fit a GPU (`mig check` answers "no")
    ├── ConfigError            2  an input file is malformed or unreadable; names file and place
    │   └── TraceFormatError   2  a trace file; names file, line and column
    ├── Unschedulable          3  a request that can never fit, not even on an empty cluster
    ├── DeviceError            4  the GPU layer failed: NVML, the driver, a simulated node
    │   ├── DriverNotFound     4  no NVIDIA driver or NVML library on this machine
    │   ├── NotAvailable       4  the device does not support the asked function
    │   └── GpuLost            4  a GPU fell off the bus; the node's other GPUs still answer
    ├── NativeLibraryError     5  a native library of gpupool is missing or cannot be loaded
    ├── PermissionDenied       6  the caller may not do this
    ├── DaemonError            7  the node daemon cannot be reached, refused, or failed
    │   └── StoreBusy          7  the daemon's state is locked by another process: retry soon
    └── KubeApiError           8  the Kubernetes API server failed or timed out

Outside the tree: a usage error (unknown option) exits 2, and a bug exits 70 ("internal error").
`gpupool exec` exits 125 for any failure of its own, as env(1) and timeout(1) do, so that it is
never taken for the command's own status; 126 and 127 are a command that cannot be run or found.
"""

from __future__ import annotations


class GpupoolError(Exception):
    """Base of every error gpupool raises on purpose; `str()` is the one line a user sees."""

    #: process exit code the CLI uses for this kind of error
    exit_code: int = 1


class InvalidRequest(GpupoolError):
    """The caller asked for something malformed or impossible (a bad quantity, name, range)."""

    exit_code = 2


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


class DeviceError(GpupoolError):
    """The GPU layer failed: NVML, the driver, a simulated node."""

    exit_code = 4


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


class PermissionDenied(GpupoolError):
    """The caller may not do this (cancel another user's job, a request without its token)."""

    exit_code = 6


class DaemonError(GpupoolError):
    """The node daemon cannot be reached, refused to start, or answered with a failure."""

    exit_code = 7


class StoreBusy(DaemonError):
    """The daemon's state database is locked by another process (a backup, an admin's sqlite3):
    the request changed nothing and may be retried in a moment (the API answers 503 with
    Retry-After)."""


class KubeApiError(GpupoolError):
    """The Kubernetes API server failed or timed out; the cause from the client is chained."""

    exit_code = 8
