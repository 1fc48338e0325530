"""docs/guides/demo-to-production.md, run as written: every ``<!-- k3a:walk -->`` block, command
by command, in one bash process (variables carry over, as in a reader's shell), from the
checkout's root. What the guide runs as the second account (``as_second ...``) runs as the OS
user ``k3a-second`` through tests/fixtures/identities.py (a forked child after ``os.setuid``:
the interpreter under /root cannot be started by that user), with the arguments as the walk's
shell expands them. Every command must exit 0; at the end production serves the tuple, judged
by the policy the second account approved, promoted by this account."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from k3artifacts.releases.channels import history
from k3artifacts.stores.file import FileStore
from tests.conftest import REPO_ROOT
from tests.fixtures.identities import k3a_as

pytestmark = pytest.mark.slow

GUIDE = REPO_ROOT / "docs" / "guides" / "demo-to-production.md"
MARKER = "<!-- k3a:walk -->"
SECOND = "as_second "


def walk_commands(text: str) -> list[str]:
    """The commands of every marked block, in order: a line ending in a backslash continues,
    and a here-document runs to its terminator."""
    commands: list[str] = []
    for part in text.split(MARKER)[1:]:
        start = part.index("```bash\n") + len("```bash\n")
        lines = part[start:part.index("\n```", start)].splitlines()
        current, heredoc = "", None
        for line in lines:
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
    """One bash process fed a command at a time; each must exit 0."""

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
        # The walk's own processes (its endpoint, if a step failed before stopping it) are in
        # this shell's session: end them by its id.
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.proc.wait()


def test_the_walk_parses_into_the_steps_it_names():
    commands = walk_commands(GUIDE.read_text())
    joined = "\n".join(commands)
    for step in ("source .venv/bin/activate", "k3a demo --next-revision", "openssl ecparam",
                 "k3a policy propose", "as_second approve", "k3a policy apply",
                 "as_second review license", "k3a eval run", "k3a promote \"$TUPLE\" production"):
        assert step in joined, step
    assert any(c.startswith("cat > ") and c.endswith("\nYAML") for c in commands)


def test_demo_to_production_walk_runs_as_written(second_user, k3a_env):
    # pytest's tmp directories are private (0700); the walk's store must be reachable by the
    # second account, so its scratch directory (the guide's `mktemp -d`) is under the system's.
    scratch = Path(tempfile.mkdtemp(prefix="k3a-walk-"))
    os.chmod(scratch, 0o755)
    env = {**k3a_env, "TMPDIR": str(scratch),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{k3a_env['PATH']}"}
    env.pop("K3A_STORE", None)
    shell = Shell(REPO_ROOT, env)
    try:
        for command in walk_commands(GUIDE.read_text()):
            if command.startswith(SECOND):
                expanded = shell.run("python3 -c 'import json, sys; "
                                     "print(json.dumps(sys.argv[1:]))' "
                                     + command[len(SECOND):])
                args = json.loads(expanded.strip().splitlines()[-1])
                store_url = shell.run('echo "$K3A_STORE"').strip()
                store = FileStore(Path(store_url.removeprefix("file://")))
                k3a_as(second_user, store, *args, env=dict(env, K3A_STORE=store_url))
            else:
                shell.run(command)
        store_url = shell.run('echo "$K3A_STORE"').strip()
        tuple_id = shell.run('echo "$TUPLE"').strip()
        walk = Path(shell.run('echo "$WALK"').strip())
    finally:
        shell.close()
    try:
        store = FileStore(Path(store_url.removeprefix("file://")))
        me = pwd.getpwuid(os.getuid()).pw_name
        entry = history(store, "production")[-1]
        assert (entry.tuple_id, entry.who, entry.policy_version) == (tuple_id, me, 2)
        rendered = list((walk / "deploy").glob("*.eks.yaml"))
        assert len(rendered) == 1
        objects = [o for o in yaml.safe_load_all(rendered[0].read_text()) if o]
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        assert deployment["metadata"]["labels"]["k3a.io/tuple-id"] == tuple_id
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # The walk leaves nothing in the checkout.
    assert not (REPO_ROOT / "deploy").exists()
