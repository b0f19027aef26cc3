"""Builds the native libraries (`make -C native`) as part of every install, editable or not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
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


setup(
    cmdclass={"build_py": BuildNativeThenPy},
    distclass=PlatformDistribution,
    package_data={"gpupool": ["_native/*.so", "_native/sim/libcuda.so.1"]},
)
