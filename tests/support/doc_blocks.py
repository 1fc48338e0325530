"""The project's pages as a reader pastes them: every fenced block, what runs it, and one bash
process that runs a page's commands in order.

A shell block (``bash``, ``sh``, ``console``) is either run by a test, named by a marker comment
on the line above it (``<!-- k3a:NAME -->``; ``RUNNERS`` in ``tests/test_docs_pages.py`` says
which test runs each NAME), or carries a note the reader sees on the line above it,
``*Not run here: WHY.*``. Every fenced block names its language, so a command block cannot pass
as a listing by leaving it out.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

SHELL = frozenset({"bash", "sh", "shell", "console"})
FENCE = re.compile(r"^( *)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"^\s*<!-- k3a:([\w-]+)\b.*-->\s*$")
NOT_RUN = re.compile(r"^\*Not run here: (.+)\*$", re.S)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    text: str
    marker: str | None
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def commands(self) -> list[str]:
        return commands_of(self.text)


def blocks_of(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order, with the marker on the line above it and the
    note in the paragraph above (the fence's, or the marker's)."""
    text = page.read_text()
    blocks = []
    for found in FENCE.finditer(text):
        above = text[:found.start()].rstrip("\n").splitlines()
        marker = MARKER.match(above[-1]) if above else None
        if marker:
            above.pop()
        paragraph: list[str] = []
        while above and above[-1].strip():
            paragraph.insert(0, above.pop().strip())
        note = NOT_RUN.match(" ".join(paragraph))
        blocks.append(Block(page=page, line=text.count("\n", 0, found.start()) + 1,
                            lang=found.group(2).strip(), text=textwrap.dedent(found.group(3)),
                            marker=marker.group(1) if marker else None,
                            not_run=note.group(1) if note else None))
    return blocks


def commands_of(block: str) -> list[str]:
    """A block's commands: a line ending in a backslash continues, and a here-document runs
    to its terminator."""
    commands: list[str] = []
    current, heredoc = "", None
    for line in block.splitlines():
        if heredoc is not None:
            current += "\n" + line
            if line == heredoc:
                commands.append(current)
                current, heredoc = "", None
            continue
        if "<<'" in line:
            heredoc = line.split("<<'", 1)[1].split("'", 1)[0]
            current += line
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                commands.append(current.strip())
            current = ""
    return commands


class Shell:
    """One bash process fed a command at a time, as a reader's terminal runs what they paste:
    variables and background jobs carry over; each command must exit 0."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)

    def run(self, command: str) -> str:
        sentinel = f"__k3a_done_{uuid.uuid4().hex}"
        self.proc.stdin.write(f"{command}\necho {sentinel} $?\n")
        self.proc.stdin.flush()
        output = []
        for line in self.proc.stdout:
            if line.startswith(sentinel):
                status = int(line.split()[1])
                break
            output.append(line)
        else:
            raise AssertionError(f"bash ended during {command!r}:\n{''.join(output)}")
        assert status == 0, f"{command!r} exited {status}:\n{''.join(output)}"
        return "".join(output)

    def close(self) -> None:
        # What the page started in the background (a server it told the reader to start) is in
        # this shell's session: end it by the session's id.
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.proc.wait()


def fresh_clone(checkout: Path, where: Path) -> Path:
    """A clone of ``checkout`` as it stands at ``where`` (edits to tracked files included:
    applied and committed in the clone, so that it starts clean), its ``.venv`` this test
    environment: what a reader has after the README's first screen."""
    # A commit needs an author, which a CI machine may not have configured.
    git = ["git", "-c", "user.name=k3a-tests", "-c", "user.email=k3a@localhost"]
    subprocess.run([*git, "clone", "-q", str(checkout), str(where)], check=True)
    edits = subprocess.run(["git", "-C", str(checkout), "diff", "--binary", "HEAD"],
                           check=True, capture_output=True).stdout
    if edits:
        subprocess.run([*git, "-C", str(where), "apply", "--index"], input=edits, check=True)
        subprocess.run([*git, "-C", str(where), "commit", "-q", "-m", "uncommitted edits"],
                       check=True)
    (where / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return where


def git_status(checkout: Path) -> str:
    return subprocess.run(["git", "-C", str(checkout), "status", "--porcelain"], check=True,
                          capture_output=True, text=True).stdout
