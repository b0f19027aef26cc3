"""No dead link in the docs (`make docs-check`): every relative markdown link of README.md,
CHANGELOG.md and docs/**.md names a file of the repository, and its `#anchor` a heading of that
page; every doc the code cites by path (src/, native/, pyproject.toml) exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: [text](target) or [text](target "title"); images too
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
#: a doc cited in code: a path under docs/, or a root document such as README.md
_CITED = re.compile(r"(?<![\w/.-])((?:docs/[\w/.-]+|[A-Z][A-Z_]+)\.md)\b")


def pages(root: Path) -> list[Path]:
    found = [root / "README.md", root / "CHANGELOG.md", *sorted(root.glob("docs/**/*.md"))]
    return [page for page in found if page.is_file()]


def _prose(text: str) -> str:
    """`text` without its code blocks and inline code, where brackets are not links."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces as -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")  # repeated headings: -1, -2, ...
    return found


def dead_links(root: Path) -> list[str]:
    """`page: target` for each relative link of the docs to a missing file or heading."""
    dead = []
    for page in pages(root):
        for target in _LINK.findall(_prose(page.read_text())):
            if re.match(r"[a-zA-Z][\w+.-]*:", target) or target.startswith("/"):
                continue  # a URL (https:, mailto:) or a path of the reader's machine
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            name = f"{page.relative_to(root)}: {target}"
            if not linked.exists():
                dead.append(name)
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                dead.append(f"{name} (no such heading)")
    return dead


def dead_citations(root: Path) -> list[str]:
    """`file: doc` for each doc that the code or the project's settings name and that is missing."""
    sources = [root / "pyproject.toml", *sorted((root / "src").rglob("*.py"))]
    sources += sorted((root / "native").rglob("*.[ch]"))
    dead = []
    for source in sources:
        for cited in _CITED.findall(source.read_text()):
            if not (root / cited).is_file():
                dead.append(f"{source.relative_to(root)}: {cited}")
    return dead


def test_every_relative_link_of_the_docs_reaches_its_file_and_heading() -> None:
    assert dead_links(ROOT) == []


def test_every_doc_the_code_cites_exists() -> None:
    assert dead_citations(ROOT) == []


def test_a_dead_link_or_anchor_is_found(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#the-a-page) [gone](docs/missing.md) [web](https://example.com/x.md)\n"
        "`[code](nowhere.md)`\n"
    )
    (tmp_path / "CHANGELOG.md").write_text("[self](#unreleased)\n\n## [Unreleased]\n")
    (docs / "a.md").write_text("# The `a` page\n\n[up](../README.md#nope)\n```\n[x](y.md)\n```\n")
    assert dead_links(tmp_path) == [
        "README.md: docs/missing.md",
        "docs/a.md: ../README.md#nope (no such heading)",
    ]


def test_a_dead_citation_in_the_code_is_found(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# here\n")
    (tmp_path / "pyproject.toml").write_text('name = "rules (DESIGN.md)"\n')
    (tmp_path / "src" / "m.py").write_text('"""See docs/here.md and docs/gone.md; out.md."""\n')
    assert dead_citations(tmp_path) == [
        "pyproject.toml: DESIGN.md",
        "src/m.py: docs/gone.md",
    ]
