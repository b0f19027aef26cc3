"""Builds the native libraries (`make -C native`) as part of every install, editable or not."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent


class BuildNativeThenPy(build_py):
    """Compile native/ into src/gpupool/_native/ before the package files are collected."""

    def run(self) -> None:
        make = shutil.which("make")
        if make is None or shutil.which("gcc") is None:
            raise SystemExit(
                "gpupool: building the native libraries needs `make` and `gcc` "
                "(Debian/Ubuntu: apt-get install build-essential)"
            )
        subprocess.run([make, "-C", str(ROOT / "native")], check=True)
        super().run()


class PlatformDistribution(Distribution):
    """The wheel carries shared libraries, so it is tagged for this platform, not pure Python."""

    def has_ext_modules(self) -> bool:
        return True


class AnyPythonWheel(bdist_wheel):
    """`py3-none-manylinux_X_Y_<arch>`: the libraries are loaded with ctypes and use no Python
    ABI, so one wheel serves every Python 3.11+; they link against glibc alone, so the build
    machine's glibc version is the manylinux floor (`auditwheel show` confirms it)."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, plat = super().get_tag()
        libc, version = platform.libc_ver()
        if plat.startswith("linux_") and libc == "glibc":
            major, minor = version.split(".")[:2]
            plat = f"manylinux_{major}_{minor}_{plat.removeprefix('linux_')}"
        return "py3", "none", plat


setup(
    cmdclass={"build_py": BuildNativeThenPy, "bdist_wheel": AnyPythonWheel},
    distclass=PlatformDistribution,
    package_data={
        "gpupool": [
            "_native/*.so",
            "_native/sim/libcuda.so.1",
            "_native/gpupool-arbiterd",
            "api/static/*",
        ]
    },
)
