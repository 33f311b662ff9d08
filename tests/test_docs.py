"""The README a newcomer reads: short, starting with its two commands, every page of docs/ one
link away, and no link that leads nowhere."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
MOST_README_LINES = 250


def links(page: Path) -> list[str]:
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", page.read_text())]


def test_the_readme_is_short_and_starts_with_its_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MOST_README_LINES
    first_block = text.split("```", 2)[1]
    assert "./scripts/demo" in first_block and "./scripts/test" in first_block
    assert (REPO / ".ci" / "run").read_text().count("scripts/test") >= 1


def test_every_page_of_the_docs_is_linked_from_the_readme() -> None:
    linked = {(REPO / target.split("#")[0]).resolve() for target in links(README)}
    pages = set(DOCS.glob("*.md"))
    assert pages, "docs/ holds the pages"
    assert not {p.resolve() for p in pages} - linked


def test_no_link_in_the_readme_or_the_docs_leads_nowhere() -> None:
    broken = []
    for page in [README, *DOCS.glob("*.md")]:
        for target in links(page):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken
