"""The one error hierarchy of gpupool; every layer maps outside failures onto it."""

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
    """No place satisfies the request."""

    exit_code = 3


class DeviceError(GpupoolError):
    """The GPU layer failed: NVML, the driver, a simulated node."""

    exit_code = 4


class DriverNotFound(DeviceError):
    """No NVIDIA driver (or NVML library) on this machine."""


class NotAvailable(DeviceError):
    """The device does not support the asked function (NVML NotSupported, missing symbol)."""


class NativeLibraryError(GpupoolError):
    """A native library of gpupool is missing or cannot be loaded."""

    exit_code = 5


class MigLayoutError(InvalidRequest):
    """A MIG layout does not fit a GPU (overlap, invalid start, too many instances)."""

    exit_code = 1


class KubeApiError(GpupoolError):
    """The Kubernetes API server failed or timed out; the cause from the client is chained."""

    exit_code = 6
