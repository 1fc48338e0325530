"""The README, run as a new user runs it: in a fresh clone, every block in order, then the
demo's printed next commands in a fresh shell.

The commands are read from README.md itself and fed one at a time to one bash process, so
variables set by one command are seen by the next, as in a reader's shell; each must exit 0.
Two things differ from a reader's machine, both named here: the clone's ``.venv`` is this test
environment (a link: installing it would need the network), so the README's install commands
(``python3 -m venv .venv && .venv/bin/pip install ...``) are left out of the lines they start;
and the suite's own command (``pytest``) and the block that stages the real model (the Hub and
AWS) are not run. The clone runs its own code (``PYTHONPATH``), from a shell whose ``PATH`` has
no ``k3a`` on it, as the README's first command leaves it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.support.doc_blocks import Shell, commands_of, fresh_clone, git_status

MARKER = "<!-- k3a:no-network-path"
#: What the README's first screen installs with; the clone's .venv is already this environment.
INSTALL = re.compile(r"^python3 -m venv \.venv && |^\.venv/bin/pip install [^&]*&& ")
#: A shell as the README's first command leaves it: the venv not activated.
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"


def readme_commands(text: str) -> list[str]:
    """The commands of the no-network block."""
    after = text[text.index(MARKER):]
    start = after.index("```bash\n") + len("```bash\n")
    return commands_of(after[start:after.index("```", start)])


def runnable_blocks(text: str) -> list[list[str]]:
    """Every bash block a reader runs on this machine, in order (those marked
    ``<!-- k3a:readme -->`` or ``<!-- k3a:no-network-path``), install commands left out; the
    others (the suite's own command, the real model's staging) say on the page why not."""
    blocks = []
    for block in re.findall(r"<!-- k3a:(?:readme|no-network-path)\b[^\n]*-->\n```bash\n(.*?)```",
                            text, flags=re.S):
        commands = []
        for command in commands_of(block):
            while INSTALL.match(command):
                command = INSTALL.sub("", command, count=1)
            commands.append(command)
        blocks.append(commands)
    return blocks


def run_in_one_shell(commands: list[str], *, cwd: Path, env: dict[str, str],
                     report: tuple[str, ...] = ("TUPLE",),
                     transcript: list[str] | None = None) -> dict[str, str]:
    """Feed ``commands`` one at a time to one bash process, as a reader's shell runs them; each
    must exit 0. Returns the shell's variables named in ``report``, as it holds them at the end;
    each command's output (stdout and stderr) is appended to ``transcript``."""
    shell = Shell(cwd, env)
    try:
        shell.run("set -o pipefail")
        for command in commands:
            said = shell.run(command)
            if transcript is not None:
                transcript.append(said)
        return {name: shell.run(f'echo "${name}"').rstrip("\n") for name in report}
    finally:
        shell.close()


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of this checkout as it stands, its .venv this test environment."""
    return fresh_clone(REPO_ROOT, tmp_path_factory.mktemp("clone") / "k3artifacts")


def reader_env(k3a_env: dict[str, str], tmp_path: Path, clone: Path) -> dict[str, str]:
    """A reader's environment: their own home, the clone's code, no k3a on PATH."""
    return {**k3a_env, "PYTHONPATH": str(clone), "PATH": CLEAN_PATH, "USER": "reader",
            "TMPDIR": str(tmp_path)}


def test_the_blocks_are_found_and_walk_the_whole_path():
    text = (REPO_ROOT / "README.md").read_text()
    joined = "\n".join(readme_commands(text))
    for step in ("source .venv/bin/activate", "k3a demo", "k3a tuple create", "--offline",
                 "k3a review license", "k3a promote", "staging", "k3a render"):
        assert step in joined
    blocks = runnable_blocks(text)
    assert blocks[0] == [".venv/bin/k3a demo"]
    assert any("--next-revision" in c for b in blocks for c in b)


def test_the_readmes_blocks_in_a_fresh_clone_leave_it_clean(clone, k3a_env, tmp_path):
    assert git_status(clone) == ""
    commands = [c for b in runnable_blocks((clone / "README.md").read_text()) for c in b]
    said: list[str] = []
    found = run_in_one_shell(commands, cwd=clone, env=reader_env(k3a_env, tmp_path, clone),
                             report=("TUPLE", "DEPLOY"), transcript=said)
    # The first command that signs (the license review) made the personal key, and said where,
    # as ssh-keygen would; nothing else needed a step of its own.
    key = Path(k3a_env["XDG_CONFIG_HOME"]) / "k3artifacts" / "keys" / "personal.pem"
    made = [i for i, out in enumerate(said) if f"made your personal key: {key}" in out]
    assert made == [commands.index('k3a review license "$TUPLE"')], said

    assert found["TUPLE"].startswith("k3t-")
    rendered = list(Path(found["DEPLOY"]).glob("*.eks.yaml"))
    assert len(rendered) == 1 and not Path(found["DEPLOY"]).is_relative_to(clone)
    objects = [o for o in yaml.safe_load_all(rendered[0].read_text()) if o]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["metadata"]["labels"]["k3a.io/tuple-id"] == found["TUPLE"]
    # The store and the demo's files are where the README says (the default store, the
    # synthetic release beside it), and the clone is as it was cloned.
    store = Path(k3a_env["XDG_DATA_HOME"]) / "k3artifacts" / "store"
    assert (store / ".k3a-demo").is_dir()
    assert git_status(clone) == ""


def test_the_demos_next_lines_run_as_printed_in_a_fresh_shell(clone, k3a_env, tmp_path):
    env = reader_env(k3a_env, tmp_path, clone)
    first = runnable_blocks((clone / "README.md").read_text())[0]
    demo = subprocess.run(["bash", "--noprofile", "--norc", "-c", " && ".join(first)],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr
    lines = demo.stdout.splitlines()
    printed = [line.removeprefix("  ") for line in lines[lines.index(next(
        line for line in lines if line.startswith("next: "))) + 2:]]
    assert printed[0].startswith("TUPLE=$(") and len(printed) == 5
    ran = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-c", "\n".join(printed)],
                         cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"/\.k3a-demo/deploy/\S+\.eks\.yaml \(\d+ objects, tuple k3t-", ran.stdout)
    assert git_status(clone) == ""
