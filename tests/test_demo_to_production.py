"""docs/guides/demo-to-production.md, run as written: every marked block, command by command,
in one bash process (variables carry over, as in a reader's shell), from the checkout's root,
as root, which the guide's step 0 (making the accounts and the group) needs; without root the
test is skipped. The second account's commands run as the guide runs them, through its own
``as_second`` (``runuser``), against the store its own ``k3a bootstrap`` gave to the group:
nothing is opened to anyone behind the guide's back.

One block differs, and only in how its venv is filled: the venv every account can run
(``<!-- k3a:walk-venv -->``) is made by the same system Python, but from this checkout's wheel
and this environment's packages (``tests/support/wheel_venv.py``) where the guide runs ``pip
install .`` (which would reach the network), and in a scratch directory instead of
``/opt/k3a-venv`` (the path is replaced in every command). Every command must exit 0; at the
end production serves the tuple, judged by the policy the second account approved, promoted
by this account, and the checkout is as the walk found it. The evaluation is the second
account's (``as_second eval run``): a login with its supplementary group runs every code case
in bubblewrap, and production is reached with no override and no policy letting code cases go
unrun.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from k3artifacts.policy.record import in_force
from k3artifacts.releases.channels import history
from k3artifacts.releases.evaluations import list_evaluations
from k3artifacts.stores.file import FileStore
from tests.conftest import REPO_ROOT
from tests.support.doc_blocks import Shell, commands_of
from tests.support.wheel_venv import wheel_venv

pytestmark = pytest.mark.slow

GUIDE = REPO_ROOT / "docs" / "guides" / "demo-to-production.md"
#: ``<!-- k3a:walk -->``, ``<!-- k3a:walk-accounts -->``, ``<!-- k3a:walk-venv -->``.
MARKER = re.compile(r"<!-- k3a:(walk[\w-]*) -->\n```bash\n(.*?)\n```", re.S)
VENV = "/opt/k3a-venv"
SYSTEM_PYTHON = "/usr/bin/python3"


def walk_blocks(text: str) -> list[tuple[str, list[str]]]:
    """Every marked block, in order: (its marker, its commands)."""
    return [(kind, commands_of(block)) for kind, block in MARKER.findall(text)]


def git_status() -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain"],
                          capture_output=True, text=True, check=True).stdout


def test_the_walk_parses_into_the_steps_it_names():
    blocks = walk_blocks(GUIDE.read_text())
    kinds = [kind for kind, _ in blocks]
    assert kinds[:2] == ["walk-accounts", "walk-venv"] and set(kinds[2:]) == {"walk"}
    joined = "\n".join(c for _, commands in blocks for c in commands)
    for step in ("groupadd", "useradd", f"{SYSTEM_PYTHON} -m venv {VENV}",
                 f"source {VENV}/bin/activate", "runuser -u k3a-second --",
                 "k3a bootstrap \"$K3A_STORE\" --group k3a-team", "k3a demo --next-revision",
                 "openssl ecparam", "as_second key create",
                 "as_second trust init --fingerprint", "as_second key show --entry k3a-second",
                 "k3a trust rotate --add", "k3a policy propose", "as_second approve",
                 "k3a policy apply", "as_second review license", "as_second eval run",
                 "k3a promote \"$TUPLE\" production"):
        assert step in joined, step
    # What a reader's shell would not do on its own is not in the guide either.
    assert "chmod 777" not in joined and "umask 0000" not in joined and "sudo" not in joined
    assert "--override-gate" not in joined and "allow_unsandboxed_code" not in joined
    assert any(c.startswith("cat > ") and c.endswith("\nYAML") for _, cs in blocks for c in cs)


def require_two_accounts() -> None:
    """Skip, with the reason, where the guide's step 0 cannot run as written."""
    if os.getuid() != 0:
        pytest.skip("the guide's step 0 makes two accounts and a group: it needs root")
    if shutil.which("runuser") is None:
        pytest.skip("the guide runs the second account's commands with util-linux's runuser")
    if shutil.which("bwrap") is None:
        pytest.skip("the guide's evaluation runs the model's code in bubblewrap (bwrap)")
    if not Path(SYSTEM_PYTHON).is_file():
        pytest.skip(f"the guide makes the venv with {SYSTEM_PYTHON}, which is not here")
    found = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if found != str(tuple(sys.version_info[:2])):
        pytest.skip(f"{SYSTEM_PYTHON} is Python {found}; the walk's venv borrows this "
                    f"environment's packages, built for {tuple(sys.version_info[:2])}")


@contextmanager
def walk_shell(k3a_env: dict[str, str]) -> Iterator[tuple[Shell, Path, Path]]:
    """A reader's shell at the checkout's root (no data or configuration directory set, so
    each account's key and pinned roots live in its own home; this checkout's code first, as
    the checkout's editable ``.venv`` imports it), a scratch directory every account may pass
    through (pytest's are private) that its ``mktemp -d`` uses, and where the scratch venv
    goes."""
    scratch = Path(tempfile.mkdtemp(prefix="k3a-walk-"))
    os.chmod(scratch, 0o755)
    env = {k: v for k, v in k3a_env.items() if k not in ("XDG_DATA_HOME", "XDG_CONFIG_HOME")}
    env["TMPDIR"] = str(scratch)
    shell = Shell(REPO_ROOT, env)
    try:
        yield shell, scratch, scratch / "k3a-venv"
    finally:
        shell.close()
        shutil.rmtree(scratch, ignore_errors=True)


def run_step_zero(shell: Shell, scratch: Path, venv: Path) -> None:
    """The guide's step 0 as written, its venv filled offline (see the module's doc)."""
    for kind, commands in walk_blocks(GUIDE.read_text()):
        if kind == "walk-accounts":
            for command in commands:
                shell.run(command)
        elif kind == "walk-venv":
            wheel_venv(REPO_ROOT, scratch / "build", python=SYSTEM_PYTHON, at=venv)
            ran = subprocess.run(["runuser", "-u", "k3a-second", "--",
                                  str(venv / "bin" / "k3a"), "--version"],
                                 capture_output=True, text=True)
            if ran.returncode != 0:
                pytest.skip("k3a-second cannot run the walk's venv (this environment's "
                            f"packages are not readable by other accounts): {ran.stderr}")


def second_account_config() -> Path:
    """Where k3a keeps ``k3a-second``'s key and pins (the test's throwaway account): removed
    before and after the walk, so its key is made on first use each time, as a new reader's."""
    return Path(pwd.getpwnam("k3a-second").pw_dir) / ".config" / "k3artifacts"


def test_demo_to_production_walk_runs_as_written(k3a_env, monkeypatch):
    require_two_accounts()
    before = git_status()
    with walk_shell(k3a_env) as (shell, scratch, venv):
        try:
            shutil.rmtree(second_account_config())
        except (KeyError, FileNotFoundError):
            pass  # no such account yet (step 0 makes it), or it never used k3a
        run_step_zero(shell, scratch, venv)
        evaluated = ""
        for kind, commands in walk_blocks(GUIDE.read_text()):
            if kind == "walk":
                for command in commands:
                    said = shell.run(command.replace(VENV, str(venv)))
                    if command.startswith("as_second eval run"):
                        evaluated = said
        store_url = shell.run('echo "$K3A_STORE"').strip()
        tuple_id = shell.run('echo "$TUPLE"').strip()
        walk = Path(shell.run('echo "$WALK"').strip())
        store = FileStore(Path(store_url.removeprefix("file://")))
        # Read as the walk's first account: the root it pinned lives in its own home.
        monkeypatch.setenv("XDG_CONFIG_HOME", str(Path(k3a_env["HOME"]) / ".config"))
        me = pwd.getpwuid(os.getuid()).pw_name
        entry = history(store, "production")[-1]
        assert (entry.tuple_id, entry.who, entry.policy_version) == (tuple_id, me, 3)
        # The second account evaluated, every code case ran in its sandbox, and the policy
        # that judged production lets none go unrun.
        assert "code ran in: bubblewrap" in evaluated and "(user namespace)" in evaluated, \
            evaluated
        assert "NOT RUN" not in evaluated and "ready" in evaluated.splitlines()[-1], evaluated
        run = [r for r in list_evaluations(store, tuple_id) if r.origin == "run"][-1]
        assert run.attached_by == "k3a-second"
        cases = run.readiness().cases
        code = [c for c in cases if c.kind == "code"]
        assert len(code) == 2 and all(c.passed and c.skipped is None for c in code), code
        rule = in_force(store).document.gates.channels["production"].evaluation
        assert rule is not None and rule.allow_unsandboxed_code is False
        rendered = list((walk / "deploy").glob("*.eks.yaml"))
        assert len(rendered) == 1
        objects = [o for o in yaml.safe_load_all(rendered[0].read_text()) if o]
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        assert deployment["metadata"]["labels"]["k3a.io/tuple-id"] == tuple_id
        # The walk's pod reads the weights once: vLLM's k3a load format verifies as it loads,
        # so no init container reads them first.
        pod = deployment["spec"]["template"]["spec"]
        (vllm,) = pod["containers"]
        assert "--load-format=k3a" in vllm["args"], vllm["args"]
        assert not pod.get("initContainers"), pod.get("initContainers")
        made = Path(k3a_env["HOME"]) / ".config" / "k3artifacts" / "keys" / "personal.pem"
        assert made.is_file() and (second_account_config() / "keys" / "personal.pem").is_file()
    shutil.rmtree(second_account_config(), ignore_errors=True)
    # The walk leaves the checkout as it found it.
    assert git_status() == before
