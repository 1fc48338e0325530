"""Storage faults: a full local disk, and published files changed behind our back."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from k3artifacts.stores.file import FileStore
from tests.faults.faultkit import (
    SHARD1,
    SHARD2,
    assert_nothing_published,
    file_gets,
    stage_args,
    verified_paths,
)
from tests.staging_helpers import REPO, run_stage, small_release
from tests.support.cli import run_process

pytestmark = pytest.mark.faults


@pytest.fixture
def small_disk(tmp_path: Path) -> Callable[[str, str], Path]:
    """``small_disk(name, size)``: a tmpfs of ``size`` mounted at tmp_path/name (root only).

    ``remount(path, size)`` on the returned path grows it in place, keeping its files: the
    operator freeing space."""
    mounted: list[Path] = []

    def make(name: str, size: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip()}); "
                        "the full-disk cases need root or CAP_SYS_ADMIN")
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def grow(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def test_full_quarantine_disk_names_file_and_resumes_after_space_freed(
        local_hub, tmp_path, small_disk, k3a_cmd, k3a_env):
    # Two 600 kB shards and small files: more than the 1 MiB quarantine disk holds.
    files = small_release(tmp_path, shard_bytes=600_000)
    local_hub.hub.add_commit(REPO, files)
    store = FileStore(tmp_path / "store")
    quarantine = small_disk("quarantine", "1m")
    args = stage_args(local_hub.endpoint, store, quarantine, "--workers", "2")

    full = run_process(*args, env=k3a_env, cmd=k3a_cmd, expect=None)
    assert full.returncode == 8, full.stderr
    assert "Traceback" not in full.stderr
    first = full.stderr.splitlines()[0]
    assert "No space left on device" in first and str(quarantine) in first
    # Usually a shard; on a loaded machine a small file may be the one the full disk refuses.
    assert any(name in first for name in files), first
    assert "--quarantine" in full.stderr and "re-run" in full.stderr
    assert_nothing_published(store)

    grow(quarantine, "8m")
    mark = len(local_hub.hub.requests)
    again = run_process(*args, env=k3a_env, cmd=k3a_cmd, expect=None)
    assert again.returncode == 0, again.stderr
    assert store.read_manifest(REPO, local_hub.hub.resolve(REPO, "main")) is not None
    # What reached the disk before it filled up was resumed, not fetched again.
    ranges = [g.range for g in file_gets(local_hub.hub, mark) if g.target in (SHARD1, SHARD2)]
    assert any(r and r != "bytes=0-" for r in ranges), ranges


def test_full_store_disk_names_store_and_keeps_quarantine(local_hub, tmp_path, small_disk,
                                                          k3a_cmd, k3a_env):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path, shard_bytes=600_000))
    store = FileStore(small_disk("store", "1m"))
    quarantine = tmp_path / "quarantine"
    args = stage_args(local_hub.endpoint, store, quarantine)

    full = run_process(*args, env=k3a_env, cmd=k3a_cmd, expect=None)
    assert full.returncode == 8, full.stderr
    assert "Traceback" not in full.stderr
    first = full.stderr.splitlines()[0]
    assert "No space left on device" in first and store.url in first
    assert_nothing_published(store)

    verified = verified_paths(quarantine, commit)
    assert SHARD1 in verified or SHARD2 in verified

    grow(store.root, "8m")
    mark = len(local_hub.hub.requests)
    again = run_process(*args, env=k3a_env, cmd=k3a_cmd, expect=None)
    assert again.returncode == 0, again.stderr
    # What was verified in quarantine before the store filled up is not fetched again.
    assert not verified & {g.target for g in file_gets(local_hub.hub, mark)}


def _writable(path: Path) -> Path:
    os.chmod(path.parent, 0o755)
    os.chmod(path, 0o644)
    return path


def test_published_files_changed_behind_our_back_are_found_by_verify(
        local_hub, file_store, tmp_path, k3a_cmd, k3a_env):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    run_stage(local_hub.endpoint, file_store, tmp_path / "quarantine")
    revision = file_store.local_path(f"models/{REPO}/{commit}")
    with open(_writable(revision / SHARD1), "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 0x01]))
    os.truncate(_writable(revision / SHARD2), (revision / SHARD2).stat().st_size - 1)
    _writable(revision / "config.json").unlink()
    (revision / "extra.py").write_text("import os\n")

    proc = run_process("verify", f"{REPO}@{commit}", "--store", file_store.url, "-q",
                       env=k3a_env, cmd=k3a_cmd, expect=None)
    assert proc.returncode == 4, proc.stderr
    problems = {line.split(":")[0].strip(): line for line in proc.stderr.splitlines()[1:5]}
    assert "xxh3-128" in problems[SHARD1]
    assert "size" in problems[SHARD2]
    assert "missing" in problems["config.json"]
    assert "not in the manifest" in problems["extra.py"]
    # Counts are of the manifest's files; the stray file is counted apart (issue 16).
    assert "3 of 7 file(s) do not match the manifest, 1 file(s) not in the manifest" in proc.stderr
    assert "do not serve this copy" in proc.stderr


def test_edited_manifest_is_caught_by_expected_digest(local_hub, file_store, tmp_path,
                                                      k3a_cmd, k3a_env):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    result = run_stage(local_hub.endpoint, file_store, tmp_path / "quarantine")
    manifest = _writable(file_store.local_path(f"models/{REPO}/{commit}/.k3a/manifest.json"))
    # Whoever swaps a shard can rewrite the manifest to match; the digest a tuple pinned cannot.
    manifest.write_bytes(manifest.read_bytes().replace(b'"config"', b'"other"', 1))

    proc = run_process("verify", f"{REPO}@{commit}", "--store", file_store.url,
                       "--expect-digest", result.manifest_digest, "-q",
                       env=k3a_env, cmd=k3a_cmd, expect=None)
    assert proc.returncode == 4, proc.stderr
    assert f"expected {result.manifest_digest}" in proc.stderr
