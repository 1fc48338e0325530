"""The wheel is the product: installed with a plain ``pip install`` (what the worker image and a
release engineer's laptop do) and run from a directory that is no checkout, it finds its
profiles, schemas and policies as package data.

The wheel is built offline into a fresh virtual environment (``tests/support/wheel_venv.py``):
nothing is downloaded and the checkout itself is not importable there (asserted, or the test
could pass on the editable install).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.support.doc_blocks import Shell, blocks_of
from tests.support.wheel_venv import wheel_venv
from tests.test_readme_path import readme_commands, run_in_one_shell

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh venv holding only the wheel built from this checkout."""
    return wheel_venv(REPO_ROOT, tmp_path_factory.mktemp("wheel")) / "bin"


@pytest.fixture
def elsewhere(installed, tmp_path) -> tuple[Path, dict[str, str]]:
    """A working directory with no policies/ or manifests/, and an environment whose PATH
    starts at the fresh venv and which points at no checkout."""
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("K3A_", "PYTHON"))}
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "home" / "data"),
               USER="reader", HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1",
               PATH=f"{installed}{os.pathsep}{os.environ['PATH']}")
    return workdir, env


def test_the_installed_package_is_the_wheel_not_the_checkout(installed, elsewhere):
    workdir, env = elsewhere
    done = subprocess.run(
        [installed / "python", "-c",
         "import k3artifacts, k3artifacts.bundled as b; print(k3artifacts.__file__);"
         "print(b.POLICIES / 'promotion-gates.yaml'); print(b.MANIFESTS / 'profiles')"],
        cwd=workdir, env=env, capture_output=True, text=True, check=True)
    module, gates, profiles = map(Path, done.stdout.split())
    assert module.is_relative_to(installed.parent) and not module.is_relative_to(REPO_ROOT)
    assert gates.is_file() and gates.is_relative_to(installed.parent)
    assert (profiles / "p6-b300-tp8.yaml").is_file()


def test_demo_and_the_readme_path_run_from_the_wheel(installed, elsewhere):
    workdir, env = elsewhere
    assert shutil.which("k3a", path=env["PATH"]) == str(installed / "k3a")
    # The block begins by activating the reader's venv: here, the one holding only the wheel.
    (workdir / ".venv").symlink_to(installed.parent)
    commands = readme_commands((REPO_ROOT / "README.md").read_text())
    # The gates of the channel just promoted to, from the policy shipped in the package.
    commands.append('k3a gates "$TUPLE" staging')
    found = run_in_one_shell(commands, cwd=workdir, env={**env, "TMPDIR": str(workdir.parent)},
                             report=("TUPLE", "DEPLOY"))
    assert found["TUPLE"].startswith("k3t-")
    assert len(list(Path(found["DEPLOY"]).glob("*.eks.yaml"))) == 1
    assert sorted(p.name for p in workdir.iterdir()) == [".venv"]


def test_the_packaged_suite_runs_by_name_from_the_wheel(installed, elsewhere, tmp_path):
    """`k3a eval run ... --suite k3-core` (and the gate's own spelling of it) from a directory
    that is no checkout: the name resolves in the policy in force: the packaged defaults for
    the first run, whose record seeds them as the store's version 1, which the second reads."""
    from k3artifacts.serving.render.common import served_names
    from k3artifacts.stores.file import FileStore
    from tests.support.openai_server import start
    from tests.support.releases import Releases

    workdir, env = elsewhere
    store = FileStore(tmp_path / "store")
    release = Releases(store, tmp_path / "scratch").release()
    server = start(served_names(release), tmp_path / "openai.log")
    packaged = (REPO_ROOT / "policies" / "eval-suites" / "k3-core.yaml").read_bytes()
    try:
        for spec, policy in (("k3-core", "packaged defaults"),
                             ("policies/eval-suites/k3-core.yaml", "version 1 (")):
            done = subprocess.run(
                [installed / "k3a", "eval", "run", server.url, "--tuple", release.id,
                 "--suite", spec, "--store", store.url], cwd=workdir, env=env,
                capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
            assert (f"suite: k3-core (eval-suites/k3-core.yaml of policy {policy}"
                    in done.stdout), done.stdout
            assert hashlib.sha256(packaged).hexdigest()[:12] in done.stdout
    finally:
        server.stop()


def test_the_signing_guide_runs_from_the_wheel(installed, elsewhere):
    """docs/guides/signing.md's blocks, from a directory that is no checkout: trusting the key
    starts from `k3a policy show --out`, the packaged defaults as the wheel carries them."""
    workdir, env = elsewhere
    (workdir / ".venv").symlink_to(installed.parent)
    # The upstream tool the page checks with is the reader's own install, after the wheel's k3a.
    upstream = Path(shutil.which("model_signing") or sys.executable).parent
    env = {**env, "PATH": f"{env['PATH']}{os.pathsep}{upstream}", "TMPDIR": str(workdir.parent)}
    shell = Shell(workdir, env)
    try:
        for block in blocks_of(REPO_ROOT / "docs" / "guides" / "signing.md"):
            if block.marker == "page":
                for command in block.commands:
                    shell.run(command)
        written = Path(shell.run('echo "$WORK"').strip()) / "policy"
    finally:
        shell.close()
    packaged = (REPO_ROOT / "policies" / "promotion-gates.yaml").read_text()
    assert (written / "promotion-gates.yaml").read_text() == packaged
    assert sorted(p.name for p in workdir.iterdir()) == [".venv"]
