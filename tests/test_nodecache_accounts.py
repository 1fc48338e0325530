"""The pull's partial directory against another real login on the node (``useradd``, then
``runuser -u``): it cannot open, plant or list anything there while the pull writes files it
hashes from memory; a partial directory another account owns, or that others can write, is
refused by name; the sealed revision is readable by every account."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_nodecache import BIG, check_copy, paused_pull, pull_json

from k3artifacts.nodecache.layout import CacheLayout, Revision
from k3artifacts.stores.file import FileStore
from tests.support.cli import invoke
from tests.support.releases import Releases

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None or shutil.which("useradd") is None,
    reason="makes a real account with useradd and runs as it with runuser: needs root and "
           "util-linux")


@contextmanager
def _account() -> Iterator[str]:
    user = f"k3a-node-{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user],
                   check=True, capture_output=True)
    try:
        yield user
    finally:
        subprocess.run(["userdel", user], check=True, capture_output=True)


@pytest.fixture
def other() -> Iterator[str]:
    with _account() as user:
        yield user


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    """A cache root every account can reach (as a hostPath is), outside pytest's own
    root-only temporary directory."""
    where = Path(tempfile.mkdtemp(prefix="k3a-node-"))
    where.chmod(0o755)
    try:
        yield where / "cache"
    finally:
        shutil.rmtree(where)


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess:
    # errors="replace": a command may print a weights file's bytes (head -c 1 of a shard).
    return subprocess.run(["runuser", "-u", user, "--", *argv], cwd="/", capture_output=True,
                          text=True, errors="replace", timeout=60)


def _releases(tmp_path: Path) -> Releases:
    return Releases(FileStore(tmp_path / "store"), tmp_path / "scratch")


def test_another_login_cannot_write_into_the_pull_it_does_not_own(
        tmp_path, node, other, k3a_cmd, k3a_env):
    releases = _releases(tmp_path)
    release = releases.release(extra={"big.bin": BIG})
    w = release.binding.weights
    layout = CacheLayout(node)
    partial = layout.partial_dir(Revision(w.repo_id, w.commit))
    resume = tmp_path / "resume"
    env = dict(k3a_env, K3A_FAULT_PAUSE="pull-part@big.bin#1:120", K3A_FAULT_RESUME=str(resume))
    proc = paused_pull(k3a_cmd, env, releases.store.url, release.id, node, tmp_path / "err")
    try:
        assert stat.S_IMODE(partial.stat().st_mode) == 0o700
        # The directory above is open to it: the partial directory's own mode is the guard.
        assert as_user(other, "ls", str(partial.parent)).returncode == 0
        for argv in (["sh", "-c", f"printf x >> {partial / '.big.bin.part'}"],
                     ["touch", str(partial / "planted")],
                     ["ls", str(partial)]):
            done = as_user(other, *argv)
            assert done.returncode != 0 and "Permission denied" in done.stderr, (argv, done)
        resume.touch()
        assert proc.wait(120) == 0, (tmp_path / "err").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    final = check_copy(node, releases.store, release)
    # Sealed: read-only, and readable by any account (vLLM's, say).
    assert as_user(other, "head", "-c", "1", str(final / "big.bin")).returncode == 0


@pytest.mark.parametrize("spoil", ["owned by another account", "writable by others"])
def test_a_partial_directory_not_this_accounts_alone_is_refused_by_name(
        tmp_path, node, other, spoil):
    releases = _releases(tmp_path)
    release = releases.release(extra={"big.bin": BIG})
    w = release.binding.weights
    partial = CacheLayout(node).partial_dir(Revision(w.repo_id, w.commit))
    partial.mkdir(parents=True)
    if spoil == "owned by another account":
        shutil.chown(partial, user=other)
        partial.chmod(0o700)
        want = "is another account's (uid "
    else:
        partial.chmod(0o777)
        want = "is writable by others (mode 777)"
    err = invoke("pull", release.id, "--store", releases.store.url, "--to", str(node),
                 expect=9).stderr
    assert f"{partial} {want}" in err and "wrote nothing there" in err, err
    assert "next:" in err and "Traceback" not in err
    assert list(partial.iterdir()) == []
    partial.rmdir()
    out = pull_json(releases.store.url, release.id, node)
    assert out["bytes_fetched"] == out["bytes"]
