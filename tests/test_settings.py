"""One list of settings: core/settings.py, the C header and the code name the same variables."""

from __future__ import annotations

import re
from pathlib import Path

from gpupool.core import settings

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "native" / "include" / "gpupool_settings.h"
NAME = re.compile(r"\bGPUPOOL_[A-Z][A-Z0-9_]*[A-Z0-9]\b")
# macros of the headers (include guards, layout constants, the API version) and the placeholder
# of a message, not variables
NOT_VARIABLES = re.compile(
    r"^GPUPOOL_(SIM_(GPU|PROC|STATE|HEADER|GPUS|PROCS|MAX|MIG)_|SIMSTATE_|ARBITER_(MAGIC|VERSION|SHARES)$"
    r"|ARBITER_(CLIENTS|SOCKET|CONTROL|VIEW_PREFIX|ANY_UID)$|ARB_[A-Z_]+$"
    r"|REGION_(MAGIC|VERSION|DEVICES|PROCS|SPANS)$"
    r"|\w+_H$|CUDA_API_VERSION$|NAME$)"
)


def header_variables() -> set[str]:
    text = HEADER.read_text()
    return set(re.findall(r'#define\s+GP_ENV_\w+\s+"(GPUPOOL_\w+)"', text))


def test_header_names_exactly_the_native_settings() -> None:
    native = {s.name for s in settings.ALL if s.reader & settings.Reader.NATIVE}
    assert header_variables() == native


def test_c_sources_read_variables_only_through_the_header() -> None:
    for source in sorted((ROOT / "native").rglob("*.c")):
        for call in re.findall(r'(?:getenv|get)\("(GPUPOOL_\w+)"\)', source.read_text()):
            raise AssertionError(f"{source.name} reads {call} by a literal: use its GP_ENV_ macro")


def test_every_name_in_the_code_is_a_declared_setting() -> None:
    files = [*(ROOT / "src" / "gpupool").rglob("*.py"), *(ROOT / "native").rglob("*.[ch]")]
    undeclared: dict[str, str] = {}
    for path in files:
        for name in NAME.findall(path.read_text()):
            if NOT_VARIABLES.match(name) or settings.by_name(name) is not None:
                continue
            undeclared.setdefault(name, path.name)
    assert not undeclared, f"GPUPOOL_* names missing from core/settings.py: {undeclared}"


def test_read_prefers_the_per_device_form_and_ignores_empty_values() -> None:
    env = {"GPUPOOL_MEMORY_LIMIT": "4Gi", "GPUPOOL_MEMORY_LIMIT_1": "2Gi", "GPUPOOL_DEBUG": ""}
    assert settings.MEMORY_LIMIT.read(env, ordinal=1) == "2Gi"
    assert settings.MEMORY_LIMIT.read(env, ordinal=0) == "4Gi"
    assert settings.DEBUG.read(env) is None
    assert settings.COMPUTE_POLICY.read({}) == "cap"
    assert settings.by_name("GPUPOOL_COMPUTE_LIMIT_12") is settings.COMPUTE_LIMIT
    assert settings.by_name("GPUPOOL_COMPUTE_POLICY_1") is None
