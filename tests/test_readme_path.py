"""The README's no-network path, run as written: from `k3a demo` to a rendered manifest.

The commands are read from README.md itself (the ```bash block after the
``<!-- k3a:no-network-path`` marker) and fed one at a time to one bash process, so variables
set by one command are seen by the next, as in a reader's shell. Each command must exit 0.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

from tests.conftest import REPO_ROOT

MARKER = "<!-- k3a:no-network-path"


def readme_commands(text: str) -> list[str]:
    """The commands of the marked block; a line ending in a backslash continues."""
    after = text[text.index(MARKER):]
    start = after.index("```bash\n") + len("```bash\n")
    block = after[start:after.index("```", start)]
    commands, current = [], ""
    for line in block.splitlines():
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                commands.append(current.strip())
            current = ""
    return commands


def run_in_one_shell(commands: list[str], *, cwd: Path, env: dict[str, str]) -> str:
    """Feed ``commands`` one at a time to one bash process, as a reader's shell runs them; each
    must exit 0. Returns ``$TUPLE`` as the shell holds it at the end."""
    shell = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        shell.stdin.write("set -o pipefail\n")
        for command in commands:
            sentinel = f"__k3a_done_{uuid.uuid4().hex}"
            shell.stdin.write(f"{command}\necho {sentinel} $?\n")
            shell.stdin.flush()
            output = []
            for line in shell.stdout:
                if line.startswith(sentinel):
                    status = int(line.split()[1])
                    break
                output.append(line)
            else:
                raise AssertionError(f"bash ended during {command!r}:\n{''.join(output)}")
            assert status == 0, f"{command!r} exited {status}:\n{''.join(output)}"
        shell.stdin.write("echo \"$TUPLE\"\n")
        shell.stdin.close()
        tuple_id = shell.stdout.read().strip()
    finally:
        if shell.poll() is None:
            shell.kill()
        shell.wait()

    return tuple_id


def test_the_block_is_found_and_walks_the_whole_path():
    commands = readme_commands((REPO_ROOT / "README.md").read_text())
    joined = "\n".join(commands)
    for step in ("source .venv/bin/activate", "k3a demo", "k3a tuple create", "--offline", "k3a review license",
                 "k3a promote", "staging", "k3a render"):
        assert step in joined


def test_readme_no_network_path_runs_command_by_command(k3a_env, tmp_path):
    # The reader's checkout, as far as the path reads it: policies/ (copied to a scratch
    # directory by the block itself); profiles come from the installed package's checkout.
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    shutil.copytree(REPO_ROOT / "policies", workdir / "policies")
    # ... and its .venv (the block starts by activating it, as a reader's fresh shell must).
    (workdir / ".venv").symlink_to(Path(sys.executable).parent.parent)
    env = {**k3a_env, "USER": "reader",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{k3a_env['PATH']}"}
    assert shutil.which("k3a", path=env["PATH"]), "k3a is not installed in this environment"
    tuple_id = run_in_one_shell(readme_commands((REPO_ROOT / "README.md").read_text()),
                                cwd=workdir, env=env)

    assert tuple_id.startswith("k3t-")
    rendered = list((workdir / "deploy").glob("*.eks.yaml"))
    assert len(rendered) == 1
    objects = [o for o in yaml.safe_load_all(rendered[0].read_text()) if o]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["metadata"]["labels"]["k3a.io/tuple-id"] == tuple_id
    # The store and the demo's files are where the README says: the default store, with
    # the synthetic release beside it, nothing in the checkout but what the block made.
    store = Path(k3a_env["XDG_DATA_HOME"]) / "k3artifacts" / "store"
    assert (store / ".k3a-demo").is_dir()
    assert sorted(p.name for p in workdir.iterdir()) == [".venv", "deploy", "policies"]
