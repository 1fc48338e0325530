"""k3a pull and k3a cache against real stores: a file tree and SeaweedFS (a real S3 server)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from k3artifacts.nodecache import locks
from k3artifacts.nodecache.layout import CacheLayout, Revision
from k3artifacts.stores.file import FileStore
from tests.support.cli import invoke
from tests.support.releases import Releases
from tests.support.waiting import wait_until

MiB = 1 << 20
BIG = os.urandom(5 * MiB + 12345)  # five whole 1 MiB parts and a short one


def pull_json(store_url: str, target: str, root: Path, *extra: str) -> dict:
    return invoke("pull", target, "--store", store_url, "--to", str(root),
                  "--part-size", "1MiB", "--concurrency", "4", "--json", *extra).json


def check_copy(root: Path, store, release) -> Path:
    w = release.binding.weights
    final = CacheLayout(root).final_dir(Revision(w.repo_id, w.commit))
    manifest = store.read_manifest(w.repo_id, w.commit)
    for record in manifest.files:
        local = final / record.path
        with store.open_read(f"models/{w.repo_id}/{w.commit}/{record.path}") as fh:
            assert local.read_bytes() == fh.read(), record.path
    assert not list(final.parent.glob(".*")), "a partial directory was left behind"
    invoke("verify", str(final), "--expect-digest", w.manifest_digest, "--json")
    return final


@pytest.fixture
def file_releases(tmp_path: Path) -> Releases:
    return Releases(FileStore(tmp_path / "store"), tmp_path / "scratch")


def test_pull_from_a_file_store_lays_out_verifies_and_is_then_a_noop(file_releases, tmp_path):
    release = file_releases.release(extra={"big.bin": BIG, "sub/dir/empty.txt": b""})
    root = tmp_path / "cache"
    out = pull_json(file_releases.store.url, release.id, root)
    assert out["tuple_id"] == release.id and not out["already_present"]
    assert out["bytes_fetched"] == out["bytes"] and out["files_fetched"] == out["files"]
    # Hashed once, from the buffers written: nothing read back from the disk.
    assert out["bytes_hashed"] == out["bytes"] and out["bytes_rehashed"] == 0
    final = check_copy(root, file_releases.store, release)
    assert json.loads((final / ".k3a/verified.json").read_text())["manifest_digest"] \
        == release.binding.weights.manifest_digest
    again = pull_json(file_releases.store.url, release.id, root)
    assert again["already_present"] and again["bytes_fetched"] == 0


@pytest.mark.s3
def test_pull_from_seaweedfs_checks_the_stored_crc64nvme(seaweed_store, tmp_path):
    releases = Releases(seaweed_store, tmp_path / "scratch")
    release = releases.release(extra={"big.bin": BIG})
    w = release.binding.weights
    out = pull_json(seaweed_store.url, f"{w.repo_id}@{w.commit}", tmp_path / "cache")
    assert out["tuple_id"] is None and out["manifest_digest"] == w.manifest_digest
    assert out["algorithms"] == ["xxh3-128", "crc64nvme"]
    assert out["bytes_fetched"] == out["bytes"]
    check_copy(tmp_path / "cache", seaweed_store, release)


def test_bytes_changed_behind_the_manifest_are_refused_and_named(file_releases, tmp_path):
    release = file_releases.release(extra={"big.bin": BIG})
    w = release.binding.weights
    stored = file_releases.store.root / f"models/{w.repo_id}/{w.commit}/big.bin"
    stored.chmod(0o644)
    with open(stored, "r+b") as fh:  # flip one byte (writing a fixed value may change nothing)
        fh.seek(3 * MiB + 7)
        byte = fh.read(1)[0]
        fh.seek(3 * MiB + 7)
        fh.write(bytes([byte ^ 0xFF]))
    root = tmp_path / "cache"
    ran = invoke("pull", release.id, "--store", file_releases.store.url, "--to",
                 str(root), "--part-size", "1MiB", expect=4)
    assert "big.bin" in ran.stderr and "xxh3-128" in ran.stderr and "next:" in ran.stderr
    layout = CacheLayout(root)
    rev = Revision(w.repo_id, w.commit)
    assert not layout.final_dir(rev).exists()
    partial = layout.partial_dir(rev)
    assert not (partial / "big.bin").exists() and not (partial / ".big.bin.part").exists()


@pytest.mark.s3
def test_an_overwritten_s3_object_fails_both_checks(seaweed, tmp_path, monkeypatch):
    from k3artifacts.stores.s3 import S3Store

    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)  # moto's fixtures may have set one
    bucket = seaweed.create_bucket(f"k3a-unversioned-{os.getpid()}", versioned=False)
    store = S3Store.from_url(f"s3://{bucket}/k3a", endpoint_url=seaweed.endpoint)
    release = Releases(store, tmp_path / "scratch").release(extra={"big.bin": BIG})
    w = release.binding.weights
    seaweed.client().put_object(Bucket=bucket, Key=f"k3a/models/{w.repo_id}/{w.commit}/big.bin",
                                Body=BIG[:-1] + b"!")
    ran = invoke("pull", release.id, "--store", store.url, "--to",
                 str(tmp_path / "cache"), "--part-size", "1MiB", expect=4)
    assert "big.bin" in ran.stderr and "CRC64NVME" in ran.stderr, ran.stderr
    assert not CacheLayout(tmp_path / "cache").final_dir(Revision(w.repo_id, w.commit)).exists()


def test_the_manifest_must_have_the_digest_the_tuple_binds(file_releases, tmp_path):
    manifest = file_releases.publish()
    release = file_releases.tuple_for(manifest, manifest_digest="0" * 64)
    err = invoke("pull", release.id, "--store", file_releases.store.url, "--to",
                 str(tmp_path / "cache"), expect=4).stderr
    assert "binds " + "0" * 64 in err


def test_a_revision_sharing_files_hard_links_them_and_fetches_the_rest(file_releases, tmp_path):
    first = file_releases.release(extra={"big.bin": BIG})
    second = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    pull_json(file_releases.store.url, first.id, root)
    out = pull_json(file_releases.store.url, second.id, root)
    store = file_releases.store
    a = store.read_manifest(first.binding.weights.repo_id, first.binding.weights.commit)
    b = store.read_manifest(second.binding.weights.repo_id, second.binding.weights.commit)
    held = {r.sha256 for r in a.files}
    assert out["bytes_fetched"] == sum(r.size for r in b.files if r.sha256 not in held)
    assert out["bytes_reused"] == sum(r.size for r in b.files if r.sha256 in held) >= len(BIG)
    assert out["bytes_rehashed"] == out["bytes_reused"]  # linked, then hashed in this run
    final = check_copy(root, store, second)
    assert (final / "big.bin").stat().st_nlink == 2


def manifest_size(store, release, path: str) -> int:
    w = release.binding.weights
    return store.read_manifest(w.repo_id, w.commit).file(path).size


def paused_pull(k3a_cmd: list[str], env: dict[str, str], store_url: str, target: str,
                root: Path, err_path: Path) -> subprocess.Popen:
    """`k3a pull` of ``target`` (1 MiB parts, one at a time), started and paused at the
    ``pull-part`` fault point ``env`` names; its stderr goes to ``err_path``."""
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [*k3a_cmd, "pull", target, "--store", store_url, "--to", str(root),
             "--part-size", "1MiB", "--concurrency", "1", "-q"],
            env=env, stderr=err, stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: b"paused at pull-part" in err_path.read_bytes()
                   or proc.poll() is not None, "the pause", timeout=60)
        assert proc.poll() is None, err_path.read_text()
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        raise
    return proc


def test_kill_9_mid_pull_then_rerun_fetches_only_what_was_missing(
        file_releases, tmp_path, k3a_cmd, k3a_env):
    release = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    env = dict(k3a_env, K3A_FAULT_PAUSE="pull-part@big.bin#2:120")
    proc = paused_pull(k3a_cmd, env, file_releases.store.url, release.id, root,
                       tmp_path / "stderr")
    try:
        # The flusher records parts 0-2 within a second of their arrival.
        sidecar = CacheLayout(root).partial_dir(Revision(
            release.binding.weights.repo_id, release.binding.weights.commit)) / ".big.bin.part.json"
        wait_until(lambda: sidecar.exists()
                   and len(json.loads(sidecar.read_bytes())["done"]) == 3,
                   "the parts record", timeout=60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    w = release.binding.weights
    layout = CacheLayout(root)
    rev = Revision(w.repo_id, w.commit)
    assert not layout.final_dir(rev).exists()
    assert (layout.partial_dir(rev) / ".big.bin.part.json").exists()
    out = pull_json(file_releases.store.url, release.id, root)
    assert out["files_kept"] == 1  # LICENSE, verified before big.bin (files go in order)
    assert out["bytes_resumed"] == (manifest_size(file_releases.store, release, "LICENSE")
                                    + 3 * MiB)
    assert out["bytes_fetched"] == out["bytes"] - out["bytes_resumed"]
    check_copy(root, file_releases.store, release)


def test_two_pulls_of_one_tuple_at_once_leave_one_complete_copy(
        file_releases, tmp_path, k3a_cmd, k3a_env):
    release = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    argv = [*k3a_cmd, "pull", release.id, "--store", file_releases.store.url, "--to", str(root),
            "--part-size", "1MiB", "--concurrency", "2", "--json"]
    # The first holds the revision lock, paused, until the second says it is waiting for it.
    resume = tmp_path / "resume"
    slow = dict(k3a_env, K3A_FAULT_PAUSE="pull-part@big.bin#0:120", K3A_FAULT_RESUME=str(resume))
    err_path, err2_path = tmp_path / "first.err", tmp_path / "second.err"
    with open(err_path, "wb") as err:
        first = subprocess.Popen(argv, env=slow, stdout=subprocess.PIPE, stderr=err)
    second = None
    try:
        wait_until(lambda: b"paused" in err_path.read_bytes() or first.poll() is not None,
                   "the first pull", timeout=60)
        with open(err2_path, "wb") as err2:
            second = subprocess.Popen(argv, env=k3a_env, stdout=subprocess.PIPE, stderr=err2)
        wait_until(lambda: b"waiting for another pull" in err2_path.read_bytes()
                   or second.poll() is not None, "the second pull to wait", timeout=60)
        resume.touch()
        out1, _ = first.communicate(timeout=120)
        out2, _ = second.communicate(timeout=120)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert first.returncode == 0 and second.returncode == 0, err2_path.read_text()
    results = [json.loads(out1), json.loads(out2)]
    assert [r["already_present"] for r in results] == [False, True]
    assert "waiting for another pull" in err2_path.read_text()
    check_copy(root, file_releases.store, release)


def test_keep_1_never_evicts_a_leased_revision(file_releases, tmp_path, k3a_cmd, k3a_env):
    old = file_releases.release()
    new = file_releases.release()
    root = tmp_path / "cache"
    pull_json(file_releases.store.url, old.id, root)
    w = old.binding.weights
    rev = Revision(w.repo_id, w.commit)
    layout = CacheLayout(root)
    server = subprocess.Popen(
        [*k3a_cmd, "cache", "lease", str(rev), "--root", str(root), "--", "sleep", "60"],
        env=k3a_env)
    try:
        wait_until(lambda: locks.is_leased(layout, rev), "the lease", timeout=60)
        out = pull_json(file_releases.store.url, new.id, root, "--keep", "1")
        assert out["evicted"] == []
        assert layout.marker(rev) is not None
        err = invoke("cache", "rm", str(rev), "--root", str(root), expect=6).stderr
        assert "leased" in err
        listing = invoke("cache", "ls", "--root", str(root), "--json").stdout
        assert [(c["revision"], c["leased"]) for c in json.loads(listing)] == [
            (str(Revision(new.binding.weights.repo_id, new.binding.weights.commit)), False),
            (str(rev), True)]
        # Sizes in a unit that shows them: a small revision is not "0.00 GiB".
        listing = invoke("cache", "ls", "--root", str(root)).stdout
        assert "0.00" not in listing
        assert re.search(r"\s\d+(\.\d)? (B|KiB|MiB)\s+\d+ files", listing), listing
    finally:
        server.kill()
        server.wait(10)
    out = invoke("cache", "gc", "--keep", "1", "--root", str(root), "--json").stdout
    assert json.loads(out)["evicted"] == [str(rev)]
    assert not layout.final_dir(rev).exists()
    err = invoke("cache", "lease", str(rev), "--root", str(root), "--", "true", expect=7).stderr
    assert "not in the cache" in err


def test_a_partial_file_later_found_in_another_revision_is_linked_and_its_part_dropped(
        file_releases, tmp_path):
    """Run 1 of B leaves part of big.bin; A (same big.bin) is then pulled whole; re-running B
    hard-links big.bin and the stale part file does not end up in the revision directory."""
    a = file_releases.release(extra={"big.bin": BIG})
    b = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    layout = CacheLayout(root)
    wb = b.binding.weights
    partial = layout.partial_dir(Revision(wb.repo_id, wb.commit))
    partial.mkdir(parents=True)
    (partial / ".big.bin.part").write_bytes(BIG[:MiB])
    pull_json(file_releases.store.url, a.id, root)
    out = pull_json(file_releases.store.url, b.id, root)
    assert out["bytes_reused"] >= len(BIG)
    final = check_copy(root, file_releases.store, b)
    assert not (final / ".big.bin.part").exists()


def test_gc_evicts_least_recently_used_first(file_releases, tmp_path):
    releases = [file_releases.release() for _ in range(3)]
    root = tmp_path / "cache"
    layout = CacheLayout(root)
    revs = []
    for age, release in zip((300, 100, 200), releases, strict=True):
        pull_json(file_releases.store.url, release.id, root)
        rev = Revision(release.binding.weights.repo_id, release.binding.weights.commit)
        used = time.time() - age
        os.utime(layout.used_file(rev), (used, used))
        revs.append(rev)
    out = invoke("cache", "gc", "--keep", "1", "--root", str(root), "--json").stdout
    result = json.loads(out)
    assert result["kept"] == [str(revs[1])]
    assert result["evicted"] == [str(revs[0]), str(revs[2])]  # oldest first
    assert [r for r in revs if layout.marker(r) is not None] == [revs[1]]
