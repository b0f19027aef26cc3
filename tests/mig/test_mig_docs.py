"""docs/mig.md carries the catalog's tables exactly as the catalog renders them."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from gpupool.mig import catalog
from gpupool.mig.catalog_tables import catalog_markdown, embedded_tables, model_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "mig.md"


def test_doc_tables_match_the_catalog() -> None:
    embedded = embedded_tables(DOC.read_text())
    assert embedded is not None, "docs/mig.md lost its catalog section markers"
    assert embedded == catalog_markdown(), (
        "docs/mig.md is out of date: replace its catalog section with "
        "the output of `gpupool mig catalog --markdown`"
    )


def test_tables_show_every_profile_row() -> None:
    for model in catalog.MODELS:
        table = model_markdown(model)
        for profile in model.profiles:
            starts = ", ".join(map(str, profile.starts))
            assert f"| {profile.name} |" in table and f"| {starts} |" in table
    assert "| 3g.20gb | 3_SLICE | 9 | 3 | 4 | 19968 | 42 | 2 | 0, 4 |" in catalog_markdown()


def test_a_document_without_markers_has_no_tables() -> None:
    assert embedded_tables("# nothing here") is None


def test_the_readme_mig_apply_example_runs_as_written(tmp_path: Path) -> None:
    readme = (DOC.parents[1] / "README.md").read_text()
    found = re.search(r"`(gpupool mig apply [^`]+)`", readme)
    assert found is not None, "README.md lost its `gpupool mig apply` example"
    command = " ".join(found.group(1).split())
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    args = [sys.executable, "-m", "gpupool", *shlex.split(command)[1:]]
    result = subprocess.run(
        args, cwd=DOC.parents[1], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "GPU 1 (H100-80GB): 1g.10gb@0, 1g.10gb@1, 2g.20gb@2, 3g.40gb@4" in result.stdout
