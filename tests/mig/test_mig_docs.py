"""docs/mig.md carries the catalog's tables exactly as the catalog renders them."""

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
