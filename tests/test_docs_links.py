"""The manual holds together: every relative link of the README and docs/ names a file that
exists, every page of docs/ is reachable from docs/index.md, and the README stays a front door
(short, pointing at docs/ for the rest)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO_ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def links(page: Path) -> list[str]:
    """Link targets outside fenced code blocks."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return LINK.findall(text)


def test_every_relative_link_names_a_file_that_exists():
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_page_of_docs_is_on_the_map():
    index = REPO_ROOT / "docs" / "index.md"
    mapped = {(index.parent / t.split("#", 1)[0]).resolve() for t in links(index)}
    unmapped = [str(p.relative_to(REPO_ROOT)) for p in PAGES[1:]
                if p != index and p.resolve() not in mapped]
    assert not unmapped, f"pages docs/index.md does not link: {unmapped}"


def test_the_readme_is_a_front_door():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    first_screen = "\n".join(lines[:40])
    # The two commands .ci/run relies on, where a newcomer sees them first.
    assert ("python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/k3a demo"
            in first_screen)
    assert ".venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest" in "\n".join(lines)
