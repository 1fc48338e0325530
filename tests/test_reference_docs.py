"""The generated reference pages are what the code says now: the CLI page from every listed
command's own --help, the policy page from the policy's model. A command, option or policy field
added, renamed or re-worded without regenerating fails here, with the command that regenerates."""

from __future__ import annotations

import pytest

from k3artifacts.cli.app import COMMANDS
from k3artifacts.cli.manual import PAGES, REGENERATE
from tests.conftest import REPO_ROOT

FILES = {"cli": "cli.md", "policy": "policy-schema.md"}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_reference_page_is_generated_from_the_code(page):
    path = REPO_ROOT / "docs" / "reference" / FILES[page]
    assert path.read_text() == PAGES[page](), (
        f"{path.relative_to(REPO_ROOT)} differs from the code: regenerate it with "
        f"`{REGENERATE.format(page=page, file=FILES[page])}`")


def test_cli_page_covers_every_listed_command_and_its_subcommands():
    text = (REPO_ROOT / "docs" / "reference" / "cli.md").read_text()
    for name, entry in COMMANDS.items():
        heading = f"## k3a {name}\n"
        assert (heading in text) == (entry.section is not None), name
    for sub in ("### k3a tuple create", "### k3a cache lease", "### k3a policy propose",
                "### k3a channel history", "### k3a revision gc"):
        assert sub in text
