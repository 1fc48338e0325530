"""The "Exit codes: ..." line of a command's help, from the one table of codes
(:data:`k3artifacts.errors.EXIT_CODES`): a command declares the codes it exits with, each with
what it means for that command where the table's general meaning is not enough.

    @exits(0, 2, (4, "the pointer does not match its history"), 7)
    @group.command("history")
    def history(...): ...

Outermost, above the click decorator: it appends the line to the command's help.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import click

from k3artifacts.errors import EXIT_CODES

#: Where a command keeps the codes it declared (code → what it says), for the tests.
DECLARED = "k3a_exit_codes"


def exit_line(codes: dict[int, str]) -> str:
    return "Exit codes: " + ", ".join(f"{code} {meaning}" for code, meaning in codes.items()) + "."


def exits(*codes: int | tuple[int, str]) -> Callable[[click.Command], click.Command]:
    """Declare the codes a command exits with: a code alone takes the table's meaning, a
    ``(code, meaning)`` pair says what it means for this command. A code not in the table
    fails at import."""
    declared: dict[int, str] = {}
    for entry in codes:
        code, meaning = entry if isinstance(entry, tuple) else (entry, EXIT_CODES.get(entry))
        assert code in EXIT_CODES, f"exit code {code} is not in errors.EXIT_CODES"
        assert code not in declared, f"exit code {code} declared twice"
        declared[code] = meaning
    assert list(declared) == sorted(declared), "exit codes in ascending order"

    def attach(command: click.Command) -> click.Command:
        assert isinstance(command, click.Command), "@exits goes above the click decorator"
        # click dedents the help when it prints it: dedent first, or the line appended
        # unindented would keep the docstring's indentation in the output.
        help_text = inspect.cleandoc(command.help or "")
        assert "Exit codes" not in help_text, f"{command.name}: exit codes restated by hand"
        command.help = f"{help_text}\n\n{exit_line(declared)}" if help_text else exit_line(
            declared)
        setattr(command, DECLARED, declared)
        return command

    return attach
