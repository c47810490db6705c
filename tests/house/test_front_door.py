"""The front door and the pages behind it: README.md stays short, every relative link in README.md and docs/
resolves (a file, and a heading in it where the link names one), and every section of the README as it was before
the pages (tests/data/readme_sections_2026-12-06.json) has its home in docs/: nothing was lost in the move."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import REPO

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)  # (a '#' line in a code block is no heading)
    return {anchor(h) for h in HEADING.findall(text)}


def test_the_readme_is_a_front_door():
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no heading #{fragment} in {file.name}")
    assert not broken, broken


def test_every_section_of_the_old_readme_has_its_home_in_docs():
    moved = json.loads((REPO / "tests" / "data" / "readme_sections_2026-12-06.json").read_text())["sections"]
    assert len(moved) == 23  # every "## " section the 1,556-line README had
    for entry in moved:
        page = REPO / entry["page"]
        assert page.exists(), entry
        assert anchor(entry["heading"]) in anchors(page), entry
