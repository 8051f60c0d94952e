"""No dangling links: every relative link and every runbook named in the SRE docs and runbooks exists,
anchors included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from monitoring_paths import REPO_ROOT, RUNBOOKS_DIR

from growpage import catalog

DOCS = sorted([*RUNBOOKS_DIR.glob("*.md"), REPO_ROOT / "README.md",
               *(REPO_ROOT / "docs" / name for name in ("MONITORING.md", "DIAGNOSE.md", "TELEMETRY.md"))])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
RUNBOOK_NAME = re.compile(r"\b(GrowPage[A-Za-z]+)\.md\b")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


def _target(source: Path, link: str) -> tuple[Path, str]:
    if link.startswith(catalog.RUNBOOK_BASE_URL + "/"):  # the repository's own runbook URLs
        file_part, _, anchor = link.removeprefix(catalog.RUNBOOK_BASE_URL + "/").partition("#")
        return RUNBOOKS_DIR / file_part, anchor
    file_part, _, anchor = link.partition("#")
    return (source.parent / file_part).resolve() if file_part else source, anchor


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(doc):
    for link in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+://", link) and not link.startswith(catalog.RUNBOOK_BASE_URL):
            continue  # external sites are not this repository's to keep
        path, anchor = _target(doc, link)
        assert path.exists(), f"{doc.name} links {link}: {path} does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{doc.name} links {link}: no heading #{anchor} in {path.name}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_every_runbook_a_doc_names_exists(doc):
    for name in RUNBOOK_NAME.findall(doc.read_text()):
        assert (RUNBOOKS_DIR / f"{name}.md").is_file(), f"{doc.name} names runbook {name}.md, which does not exist"
