"""Where the native libraries built from native/ live: the interception library, the
simulated CUDA driver (installed as sim/libcuda.so.1) and the compute arbiter's program."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import NativeLibraryError

NATIVE_DIR = Path(__file__).resolve().parent.parent / "_native"
SHIM_LIBRARY = "libgpupool-cuda.so"
SIM_DIR = "sim"
SIM_DRIVER_NAME = "libcuda.so.1"
ARBITERD = "gpupool-arbiterd"
_FIX = "run `make native` in the source tree, or reinstall gpupool"


@dataclass(frozen=True)
class NativeLibraries:
    """Paths of the built libraries under one directory."""

    root: Path

    @property
    def shim(self) -> Path:
        return self.root / SHIM_LIBRARY

    @property
    def sim_driver(self) -> Path:
        return self.root / SIM_DIR / SIM_DRIVER_NAME

    @property
    def arbiterd(self) -> Path:
        return self.root / ARBITERD

    @property
    def sim_dir(self) -> Path:
        """The directory to put on LD_LIBRARY_PATH so `libcuda.so.1` is the simulated driver."""
        return self.root / SIM_DIR


def _require(path: Path, what: str) -> Path:
    if not path.is_file():
        raise NativeLibraryError(f"{what} {path} is missing: {_FIX}")
    return path


def native_libraries(root: Path = NATIVE_DIR) -> NativeLibraries:
    """The libraries under `root` (default: the installed package's `_native/`)."""
    return NativeLibraries(root)


def shim_library(root: Path = NATIVE_DIR) -> Path:
    """The interception library, or NativeLibraryError saying how to build it."""
    return _require(native_libraries(root).shim, "the gpupool interception library")


def sim_driver_dir(root: Path = NATIVE_DIR) -> Path:
    """The directory holding the simulated driver as libcuda.so.1, or NativeLibraryError."""
    libs = native_libraries(root)
    _require(libs.sim_driver, "the gpupool simulated CUDA driver")
    return libs.sim_dir


def arbiterd_program(root: Path = NATIVE_DIR) -> Path:
    """The trusted compute arbiter's program, or NativeLibraryError saying how to build it."""
    return _require(native_libraries(root).arbiterd, "the gpupool compute arbiter")
