"""Exit codes are decided by error class only, from one table: no exception class outside
``k3artifacts/errors.py`` sets one, every command's help says its codes in one line made by
``cli/exits.py`` from ``errors.EXIT_CODES``, and the reference page agrees with the table."""

from __future__ import annotations

import importlib
import pkgutil
import re

import click
import pytest

import k3artifacts
from k3artifacts.cli.exits import DECLARED, exit_line, exits
from k3artifacts.errors import EXIT_CODES
from tests.conftest import REPO_ROOT


def _modules() -> list:
    found = [k3artifacts]
    for info in pkgutil.walk_packages(k3artifacts.__path__, "k3artifacts."):
        # An import that fails is a failure here, never a module skipped unchecked.
        found.append(importlib.import_module(info.name))
    return found


MODULES = _modules()


def test_every_module_of_the_package_is_walked():
    names = {m.__name__ for m in MODULES}
    assert {"k3artifacts.errors", "k3artifacts.cli.exits", "k3artifacts.releases.channels",
            "k3artifacts.policy.record", "k3artifacts.trust.chain"} <= names


def _exception_classes() -> set[type]:
    """Every exception class defined so far (all of the package is imported above), however
    deep in the hierarchy and wherever it was bound."""
    found, todo = set(), [BaseException]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def test_no_exception_class_outside_errors_sets_an_exit_code():
    ours = {c for c in _exception_classes() if c.__module__.startswith("k3artifacts.")}
    assert {"StoredRecordRefused", "CorruptRecord", "SettingsRefused"} <= {c.__name__ for c in ours}
    setters = sorted(f"{c.__module__}.{c.__qualname__}" for c in ours
                     if c.__module__ != "k3artifacts.errors" and "exit_code" in vars(c))
    assert setters == [], (
        "exit codes are decided by class in k3artifacts/errors.py: subclass the class there "
        f"that means what you raise (a stored record: StoredRecordRefused) instead: {setters}")


def _commands() -> dict[str, click.Command]:
    """Every command of the tree by its path, and every command a cli module defines (the
    forms `k3a bootstrap` dispatches to are reached only through it)."""
    from k3artifacts.cli.app import cli

    found: dict[str, click.Command] = {}

    def walk(command: click.Command, path: str) -> None:
        found[path] = command
        if isinstance(command, click.Group):
            ctx = click.Context(command, info_name=path)
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), f"{path} {name}")

    walk(cli, "k3a")
    for module in MODULES:
        if module.__name__.startswith("k3artifacts.cli."):
            for name, obj in vars(module).items():
                if isinstance(obj, click.Command) and obj not in found.values():
                    found[f"{module.__name__}:{name}"] = obj
    return found


COMMANDS = _commands()


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_command_says_its_exit_codes_once_from_the_table(path):
    command = COMMANDS[path]
    text = command.help or ""
    declared = getattr(command, DECLARED, None)
    if isinstance(command, click.Group) and path != "k3a":
        # A group runs nothing of its own: its subcommands say their codes.
        assert declared is None and "Exit codes" not in text, path
        return
    assert declared is not None, f"{path}: declare its exit codes with @exits (cli/exits.py)"
    assert text.count("Exit codes") == 1, path
    assert text.endswith(exit_line(declared)), path
    assert set(declared) <= set(EXIT_CODES)


def test_the_root_help_lists_the_whole_table():
    from k3artifacts.cli.app import cli

    assert getattr(cli, DECLARED) == EXIT_CODES


def test_a_code_not_in_the_table_is_refused_at_declaration():
    with pytest.raises(AssertionError, match="11 is not in errors.EXIT_CODES"):
        exits(0, (11, "a code nobody documented"))


def test_a_command_restating_its_codes_by_hand_is_refused():
    @click.command("x")
    def x() -> None:
        """Do x. Exit codes: 0 ok."""

    with pytest.raises(AssertionError, match="restated by hand"):
        exits(0)(x)


def test_the_reference_page_agrees_with_the_table():
    text = (REPO_ROOT / "docs" / "reference" / "exit-codes.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| ([^|]*) \|", text, re.MULTILINE))
    assert sorted(int(code) for code in rows) == sorted(EXIT_CODES)
    for code, meaning in EXIT_CODES.items():
        assert rows[str(code)].startswith(meaning), (code, rows[str(code)], meaning)
