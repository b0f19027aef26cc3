"""The one choke point for NVML calls: lazy init, "not available" not crashes, errors mapped."""

from __future__ import annotations

import ctypes
import importlib
import logging
from collections.abc import Iterable
from typing import Any, Final

from gpupool.core.errors import DeviceError, DriverNotFound, GpuLost, NotAvailable

log = logging.getLogger(__name__)

DRIVER_HINT = (
    "Install the NVIDIA driver, or use --simulate SPEC (e.g. --simulate 8xH100-80GB) "
    "to run on simulated GPUs (--node-dir DIR or $GPUPOOL_SIM_NODE for an existing simulated "
    "node, such as a daemon's)."
)


class _NotAvailableType:
    """The type of NOT_AVAILABLE: a reading the device or driver does not give."""

    _instance: _NotAvailableType | None = None

    def __new__(cls) -> _NotAvailableType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_AVAILABLE"

    def __bool__(self) -> bool:
        return False


NOT_AVAILABLE: Final = _NotAvailableType()


# error codes that mean "this reading does not exist here", never a failure of the node
_ABSENT_CODES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")
_NO_DRIVER_CODES = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")


def text(value: Any) -> str:
    """NVML strings arrive as bytes or str depending on the nvidia-ml-py version."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class Nvml:
    """Lazily initialised NVML; every call of the NVML backend goes through `query` or `command`.

    `module` is the `pynvml` module, or an object with the same attributes (tests inject a
    scenario fake); None imports pynvml on first use.
    """

    def __init__(self, module: Any = None) -> None:
        self._module = module
        self._initialized = False
        self._logged_missing: set[str] = set()

    @property
    def module(self) -> Any:
        if self._module is None:
            try:
                self._module = importlib.import_module("pynvml")
            except ImportError as err:
                raise DriverNotFound(
                    f"NVIDIA driver not found: the nvidia-ml-py package is missing ({err}). "
                    + DRIVER_HINT
                ) from err
        return self._module

    def constant(self, name: str, default: Any = None) -> Any:
        """An NVML constant or ctypes type by name; `default` where this pynvml lacks it."""
        return getattr(self.module, name, default)

    def _code(self, name: str) -> int | None:
        value = self.constant(name)
        return value if isinstance(value, int) else None

    def _is(self, err: BaseException, names: Iterable[str]) -> bool:
        value = getattr(err, "value", None)
        return value is not None and any(value == self._code(name) for name in names)

    def init(self) -> None:
        """nvmlInit once; a missing library or driver becomes DriverNotFound with the fix."""
        if self._initialized:
            return
        module = self.module
        try:
            module.nvmlInit()
        except module.NVMLError as err:
            if self._is(err, _NO_DRIVER_CODES):
                raise DriverNotFound(f"NVIDIA driver not found: {err}. {DRIVER_HINT}") from err
            raise DeviceError(f"NVML failed to initialise: {err}") from err
        except OSError as err:  # a broken libnvidia-ml.so found by the loader
            raise DriverNotFound(f"NVIDIA driver not found: {err}. {DRIVER_HINT}") from err
        self._initialized = True

    def shutdown(self) -> None:
        if self._initialized:
            self._initialized = False
            try:
                self.module.nvmlShutdown()
            except self.module.NVMLError as err:
                log.info("nvmlShutdown failed: %s", err)

    def _missing(self, name: str) -> None:
        if name not in self._logged_missing:
            self._logged_missing.add(name)
            log.info("NVML function %s is not available here", name)

    def _call(
        self,
        names: str | tuple[str, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        absent: tuple[str, ...],
    ) -> Any:
        """Try each name in order (newest version first); NOT_AVAILABLE when none answers."""
        self.init()
        module = self.module
        for name in (names,) if isinstance(names, str) else names:
            function = getattr(module, name, None)
            if function is None:
                self._missing(name)
                continue
            try:
                return function(*args, **kwargs)
            except module.NVMLError as err:
                if self._is(err, ("NVML_ERROR_FUNCTION_NOT_FOUND",)):
                    self._missing(name)
                    continue
                if self._is(err, _ABSENT_CODES + absent):
                    return NOT_AVAILABLE
                if self._is(err, ("NVML_ERROR_GPU_IS_LOST",)):
                    raise GpuLost(f"GPU is lost ({name}: {err})") from err
                raise DeviceError(f"NVML {name} failed: {err}") from err
        return NOT_AVAILABLE

    def query(
        self, names: str | tuple[str, ...], *args: Any, absent: tuple[str, ...] = (), **kwargs: Any
    ) -> Any:
        """A reading: NOT_AVAILABLE where unsupported, missing, or not permitted to us.

        `absent` names further NVML error codes that mean "nothing here" for this call.
        """
        return self._call(names, args, kwargs, ("NVML_ERROR_NO_PERMISSION", *absent))

    def command(self, names: str | tuple[str, ...], *args: Any, what: str, **kwargs: Any) -> Any:
        """An action: raises with `what` named where NVML refuses or lacks it."""
        self.init()  # outside the mapping below: a missing driver keeps its own message
        module = self.module
        try:
            result = self._call(names, args, kwargs, ())
        except GpuLost:
            raise
        except DeviceError as err:
            cause = err.__cause__
            if cause is not None and self._is(cause, ("NVML_ERROR_NO_PERMISSION",)):
                raise DeviceError(f"{what} needs root: run as root or with sudo") from cause
            if cause is not None and self._is(cause, ("NVML_ERROR_IN_USE",)):
                raise DeviceError(f"{what} refused: the GPU or instance is in use") from cause
            if isinstance(cause, module.NVMLError):
                raise DeviceError(f"{what} failed: {cause}") from cause
            raise
        if result is NOT_AVAILABLE:
            raise NotAvailable(f"{what} is not supported by this GPU or driver")
        return result

    def handle_array(self, type_name: str, size: int) -> tuple[Any, Any]:
        """A ctypes array of `size` NVML structs/handles plus a count pointer, for list calls."""
        array = (self.constant(type_name) * size)()
        return array, ctypes.pointer(ctypes.c_uint(size))
