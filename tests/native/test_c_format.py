"""The C sources (native/ and the test programs) are formatted as .clang-format says.

clang-format comes from PyPI (the `test` extra pins its major version: another major formats
differently), so every machine that runs the suite checks the same style. Fix a failure with
`.venv/bin/clang-format -i FILE...`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import clang_format

REPO = Path(__file__).resolve().parents[2]
STYLE = REPO / ".clang-format"


def c_sources() -> list[Path]:
    native = [p for p in (REPO / "native").rglob("*") if p.suffix in (".c", ".h")]
    progs = [p for p in (REPO / "tests").glob("*/progs/*") if p.suffix in (".c", ".h")]
    return sorted(native + progs)


def test_every_c_file_is_formatted() -> None:
    files = c_sources()
    assert STYLE.is_file() and len(files) > 30, "the C sources or .clang-format moved"
    done = subprocess.run(
        [
            clang_format.get_executable("clang-format"),
            f"--style=file:{STYLE}",
            "--dry-run",
            "--Werror",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
    )
    # one "FILE:LINE:COL: error: code should be clang-formatted" per misplaced line
    unformatted = sorted(set(re.findall(r"^(.+?):\d+:\d+: error:", done.stderr, re.MULTILINE)))
    names = [str(Path(f).relative_to(REPO)) for f in unformatted]
    assert done.returncode == 0 and not names, (
        f"not clang-formatted: {', '.join(names) or done.stderr}"
    )
