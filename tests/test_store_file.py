"""The POSIX store: exclusive create, compare-and-swap and atomic publication."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest
import xxhash

from k3artifacts.errors import AlreadyExists, ConfigError, Conflict
from k3artifacts.revisions.manifest import FileRecord, LicenseRecord, ShardManifest
from k3artifacts.stores.file import FileStore
from k3artifacts.stores.registry import open_store

COMMIT = "a" * 40


def make_revision(tmp_path: Path, files: dict[str, bytes]) -> tuple[ShardManifest, Path]:
    src = tmp_path / "src"
    records = []
    for path, data in files.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_bytes(data)
        records.append(FileRecord(path=path, size=len(data), kind="other",
                                  sha256=hashlib.sha256(data).hexdigest(),
                                  xxh3_128=xxhash.xxh3_128_hexdigest(data)))
    manifest = ShardManifest(repo_id="org/model", commit=COMMIT, files=records,
                             license=LicenseRecord(path=None, sha256=None, text=None),
                             remote_code=[], total_bytes=sum(map(len, files.values())))
    return manifest, src


def publish(store: FileStore, manifest: ShardManifest, src: Path) -> None:
    writer = store.begin_revision(manifest.repo_id, manifest.commit)
    for record in manifest.files:
        writer.put_file(record, src / record.path)
    writer.commit(manifest)


def test_create_is_exclusive_under_threads(file_store):
    winners, losers = [], []

    def attempt(i: int) -> None:
        try:
            file_store.create("releases/tuples/x.json", f"body {i}".encode())
            winners.append(i)
        except AlreadyExists:
            losers.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(losers) == 15
    assert file_store.read("releases/tuples/x.json").data == f"body {winners[0]}".encode()


def test_replace_is_compare_and_swap(file_store):
    token = file_store.replace("releases/channels/prod.json", b"one", None)
    with pytest.raises(Conflict):
        file_store.replace("releases/channels/prod.json", b"two", None)
    token2 = file_store.replace("releases/channels/prod.json", b"two", token)
    with pytest.raises(Conflict):
        file_store.replace("releases/channels/prod.json", b"three", token)
    assert file_store.read("releases/channels/prod.json").token == token2


def test_revision_invisible_until_commit_then_read_only(file_store, tmp_path):
    manifest, src = make_revision(tmp_path, {"a.safetensors": b"x" * 100, "sub/config.json": b"{}"})
    writer = file_store.begin_revision("org/model", COMMIT)
    for record in manifest.files:
        writer.put_file(record, src / record.path)
    assert file_store.list_revisions("org/model") == []
    assert file_store.read_manifest("org/model", COMMIT) is None
    writer.commit(manifest)
    assert file_store.list_revisions("org/model") == [COMMIT]
    assert file_store.read_manifest("org/model", COMMIT) == manifest
    published = file_store.local_path(f"models/org/model/{COMMIT}/a.safetensors")
    assert not os.access(published, os.W_OK) or os.geteuid() == 0
    assert published.stat().st_mode & 0o222 == 0


def test_republishing_identical_is_noop_and_different_is_refused(file_store, tmp_path):
    manifest, src = make_revision(tmp_path, {"a": b"1"})
    publish(file_store, manifest, src)
    publish(file_store, manifest, src)
    other, src2 = make_revision(tmp_path / "o", {"a": b"2"})
    with pytest.raises(Conflict, match="refusing to overwrite"):
        publish(file_store, other, src2)
    assert file_store.read_manifest("org/model", COMMIT) == manifest


def test_abort_leaves_nothing(file_store, tmp_path):
    manifest, src = make_revision(tmp_path, {"a": b"1"})
    writer = file_store.begin_revision("org/model", COMMIT)
    writer.put_file(manifest.files[0], src / "a")
    writer.abort()
    assert file_store.list_keys("models/") == []


def test_delete_revision(file_store, tmp_path):
    manifest, src = make_revision(tmp_path, {"a": b"1"})
    publish(file_store, manifest, src)
    file_store.delete_revision("org/model", COMMIT)
    assert file_store.list_revisions("org/model") == []


@pytest.mark.parametrize("url", ["file://host/x", "ftp://x/y", "file://"])
def test_bad_store_urls(url):
    with pytest.raises(ConfigError):
        open_store(url)


def test_bad_keys_refused(file_store):
    with pytest.raises(ConfigError):
        file_store.read("../etc/passwd")
