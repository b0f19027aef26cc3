"""The rules of docs/architecture.md hold: its import-linter contracts (pyproject.toml: the
layers, no cycles, pure core/ and mig/, the client's and the API's imports of the agent), and
what the API does with the Agent it is given: its commands and its view, never its parts."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "src" / "gpupool" / "api"
#: what api/ may use of the agent: its read interface and its commands (services: the service
#: manager's, agent/service_manager.py)
AGENT_FACE = {
    *("view", "submit", "cancel", "drain", "prune", "suspend", "resume", "resize", "services"),
}


def test_import_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is part of the test extras"
    result = subprocess.run(
        [exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_api_never_reaches_into_the_agents_parts() -> None:
    parts = re.compile(r"agent\.(store|watchdog|observed|mps_jobs|mig|backend|launch_node)\b")
    # `agent.NAME` as an expression (not `gpupool.agent.NAME`, a module)
    used = re.compile(r"(?<![\w.])agent\.(\w+)")
    for path in sorted(API.glob("*.py")):
        text = path.read_text()
        assert not parts.search(text), f"{path.name}: {parts.search(text)}"
        beyond = set(used.findall(text)) - AGENT_FACE
        assert not beyond, f"{path.name} uses agent.{', agent.'.join(sorted(beyond))}"
