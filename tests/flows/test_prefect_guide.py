"""docs/guides/prefect.md's loopback block, run as written: a local hub, a Prefect server on
127.0.0.1 with analytics off, the flows served, a staging run and a promotion that the second
account approves. Its prerequisites are the walk's step 0 (two accounts, their group, a venv
every account can run), run as tests/test_demo_to_production.py runs them; as there, the
venv's path in the block is the test's scratch venv. Root only (skipped otherwise, with the
reason); slow: a Prefect server's start alone takes 15-45 s here."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from k3artifacts.releases.channels import history
from k3artifacts.stores.file import FileStore
from tests.conftest import REPO_ROOT
from tests.test_demo_to_production import (
    VENV,
    commands_of,
    require_two_accounts,
    run_step_zero,
    second_account_config,
    walk_shell,
)

pytestmark = pytest.mark.slow

GUIDE = REPO_ROOT / "docs" / "guides" / "prefect.md"
BLOCK = re.compile(r"<!-- k3a:prefect-loopback -->\n```bash\n(.*?)\n```", re.S)


def test_the_loopback_block_turns_analytics_off_and_uses_the_local_hub():
    [block] = BLOCK.findall(GUIDE.read_text())
    assert "DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false" in block
    assert "python -m k3artifacts.localhub" in block and "--host 127.0.0.1" in block
    assert "as_second approve" in block


@pytest.mark.timeout(600)
def test_the_prefect_guide_runs_on_loopback_as_written(k3a_env, monkeypatch):
    require_two_accounts()
    [block] = BLOCK.findall(GUIDE.read_text())
    with walk_shell(k3a_env) as (shell, scratch, venv):
        try:  # the second account's key is made anew, below
            shutil.rmtree(second_account_config())
        except (KeyError, FileNotFoundError):
            pass  # no such account yet (step 0 makes it), or it never used k3a
        run_step_zero(shell, scratch, venv)
        # A reader who ran the walk first, as the guide tells them to: k3a-second has a key.
        shell.run(f"runuser -u k3a-second -- {venv / 'bin' / 'k3a'} key create")
        for command in commands_of(block):
            shell.run(command.replace(VENV, str(venv)))
        # Its last lines stopped everything it started: no job left, no flows still served.
        assert shell.run("jobs -r") == ""
        served = subprocess.run(["pgrep", "-s", str(shell.proc.pid), "-f", "flows.serve"],
                                capture_output=True, text=True)
        assert served.stdout == "", "flows.serve outlived the guide's stop lines"
        store = FileStore(shell.run('echo "${K3A_STORE#file://}"').strip())
        tuple_id = shell.run('echo "$TUPLE"').strip()
        # Read as the guide's first account: the root it pinned lives in its own home.
        monkeypatch.setenv("XDG_CONFIG_HOME", str(Path(k3a_env["HOME"]) / ".config"))
        [entry] = history(store, "staging")
        assert entry.tuple_id == tuple_id and entry.approval.who == "k3a-second"
    shutil.rmtree(second_account_config(), ignore_errors=True)
