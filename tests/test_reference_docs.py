"""The generated reference pages are what the code says now: the CLI page from every listed
command's own --help, the policy page from the policy's model, the architecture page's package
map from the packages' docstrings and files and its layering from the import contracts. A
command, option, policy field, package, module or contract added, renamed or re-worded without
regenerating fails here, with the command that regenerates."""

from __future__ import annotations

import pytest

from k3artifacts.cli.app import COMMANDS
from k3artifacts.cli.manual import IN_PLACE, PAGES, REGENERATE, REWRITE
from k3artifacts.cli.package_map import library_layers, modules, regenerate
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


def test_architecture_page_package_map_and_layering_are_generated_from_the_code():
    path = REPO_ROOT / IN_PLACE["architecture"]
    text = path.read_text()
    assert regenerate(text, REPO_ROOT) == text, (
        f"{IN_PLACE['architecture']}'s package map or layering differs from the code: "
        f"regenerate them with `{REWRITE.format(page='architecture')}`")


def test_every_library_package_and_module_is_in_a_layer():
    """The layers contract is not exhaustive: a package left out of it would be checked by
    nothing, and would sit at the bottom of the package map."""
    layered = {name for layer in library_layers(REPO_ROOT) for name in layer}
    top = {name.rstrip("/") for name in modules(REPO_ROOT / "k3artifacts")} - {"__main__"}
    assert top - layered == set(), "add them to the layers in pyproject.toml"
