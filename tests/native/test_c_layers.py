"""The C parts of each native program call each other in layers: no two source files of one
library or program use each other's functions or globals, directly or round a longer loop, so each
file can be read with only the ones below it in mind (as import-linter holds the Python)."""

from __future__ import annotations

import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[2] / "native"
PARTS = ("shim", "simcuda", "arbiterd")

# comments, strings, characters and preprocessor lines: none of them is a definition or a use
COMMENT = re.compile(
    r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|^[ \t]*#(?:\\\n|[^\n])*",
    re.S | re.M,
)
# a function defined at the top level and not static: its name before the parameters' "(",
# the signature on one line or several, then its body
FUNCTION = re.compile(r"^(?!static\b|typedef\b)[A-Za-z_][\w \t\*]*?\b(\w+)\([^;{}]*\)\s*\{", re.M)
# a global defined at the top level: `type name[...] = ...;`, neither static nor extern
GLOBAL = re.compile(
    r"^(?!static\b|extern\b|typedef\b)[A-Za-z_][\w \t\*]*?\b(\w+)(?:\[[^\]]*\])?\s*(?:=[^;]*)?;",
    re.M,
)
NAME = re.compile(r"\b[A-Za-z_]\w*\b")
# the interception library's GP_REAL(cuX) and __typeof__(&cuX) name the real driver's cuX, not
# the library's own wrapper of that name
REAL = re.compile(r"\bGP_REAL\(\w+\)|__typeof__\(&\w+\)")


def _code(path: Path) -> str:
    return REAL.sub(" ", COMMENT.sub(" ", path.read_text()))


def uses(folder: Path) -> dict[str, set[str]]:
    """Each source file of `folder` -> the other files whose functions or globals it names."""
    code = {path.name: _code(path) for path in sorted(folder.glob("*.c"))}
    owner = {}
    for name, text in code.items():
        for found in (*FUNCTION.findall(text), *GLOBAL.findall(text)):
            if not found.startswith("__"):  # __attribute__((constructor)) is not a function
                owner[found] = name
    return {
        name: {owner[word] for word in set(NAME.findall(text)) if owner.get(word, name) != name}
        for name, text in code.items()
    }


@pytest.mark.parametrize("part", PARTS)
def test_the_files_of_a_native_part_call_each_other_without_a_loop(part: str) -> None:
    graph = uses(NATIVE / part)
    assert len(graph) > 1 and any(graph.values()), graph  # the reading found the calls
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as err:
        pytest.fail(f"native/{part}: these files use each other in a loop: {err.args[1]}")


def test_a_loop_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.c").write_text("int a_count;\nvoid a(void) { b(); }\n")
    (tmp_path / "b.c").write_text("/* a() is not a use */\nvoid b(void)\n{\n    a_count++;\n}\n")
    assert uses(tmp_path) == {"a.c": {"b.c"}, "b.c": {"a.c"}}
