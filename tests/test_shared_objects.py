"""A new commit costs what it changed: the store layout of docs/architecture.md, "Storage
layout". Bytes are counted at the store itself (every object version SeaweedFS keeps; every
distinct inode under the file store's root), not from k3a's own counters.

On the file store an unchanged file of a new commit is a hard link to the published one; on
S3 it is a reference (key + VersionId) in the new revision's object records, and the prefix
gets its own copy only when a server reads it (:meth:`S3Store.materialize`). gc keeps every
object a kept revision reads; verify and pull follow the references."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from k3artifacts.errors import Conflict
from k3artifacts.policy.model import load_gate_policy
from k3artifacts.releases.binding import bind
from k3artifacts.releases.retention import plan, retire
from k3artifacts.stores.base import OBJECT_RECORDS_REL
from k3artifacts.stores.verify import verify_revision
from tests.staging_helpers import REPO, run_stage, small_release
from tests.support.cli import invoke
from tests.support.releases import Releases
from tests.support.revisions import REPO as WRITER_REPO
from tests.support.revisions import manifest_for, publish, write_revision

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
SHARD_BYTES = 3 << 20


@pytest.fixture(params=["file", pytest.param("seaweed", marks=pytest.mark.s3)])
def store(request):
    return request.getfixturevalue("file_store" if request.param == "file" else "seaweed_store")


def stored_bytes(store) -> int:
    """Bytes the store holds, as the store itself counts them."""
    if store.local_root is not None:
        seen: dict[int, int] = {}
        for dirpath, _, names in os.walk(store.local_root):
            for name in names:
                st = os.lstat(os.path.join(dirpath, name))
                seen[st.st_ino] = st.st_size
        return sum(seen.values())
    total = 0
    pages = store.client.get_paginator("list_object_versions").paginate(Bucket=store.bucket)
    for page in pages:
        total += sum(v["Size"] for v in page.get("Versions", []))
    return total


def two_commits(local_hub, store, tmp_path: Path):
    """Commit 1, then commit 2 changing only SHARD2; returns (c1, c2, second's result,
    bytes the store gained with commit 2)."""
    files = small_release(tmp_path, shard_bytes=SHARD_BYTES, seed=0)
    c1 = local_hub.hub.add_commit(REPO, files)
    run_stage(local_hub.endpoint, store, tmp_path / "q")
    before = stored_bytes(store)
    changed = {**files, SHARD2: small_release(tmp_path, shard_bytes=SHARD_BYTES, seed=1)[SHARD2]}
    c2 = local_hub.hub.add_commit(REPO, changed)
    second = run_stage(local_hub.endpoint, store, tmp_path / "q")
    assert second.commit == c2 != c1
    return c1, c2, second, stored_bytes(store) - before


def pull(store, ref: str, root: Path) -> dict:
    return invoke("pull", ref, "--store", store.url, "--to", str(root), "--part-size", "1MiB",
                  "--json").json


def pulled_matches(local_hub, commit: str, out: dict) -> None:
    """Every file of the upstream commit is on the node, byte for byte as the hub has it."""
    for path, entry in local_hub.hub.files(REPO, commit).items():
        got = hashlib.sha256((Path(out["path"]) / path).read_bytes()).hexdigest()
        assert got == entry.sha256, path


def test_a_one_shard_commit_stores_only_that_shard(local_hub, store, tmp_path):
    c1, c2, second, gained = two_commits(local_hub, store, tmp_path)
    shard2 = store.read_manifest(REPO, c2).file(SHARD2).size
    # The changed shard, its new manifest and object records: nothing of the unchanged files.
    assert shard2 <= gained < shard2 + (64 << 10), (gained, shard2)
    assert second.store_stats.get("bytes_copied", 0) == 0
    assert second.downloaded_bytes == shard2
    for commit in (c1, c2):
        assert verify_revision(store=store, repo_id=REPO, commit=commit, full=True).ok
    pulled_matches(local_hub, c2, pull(store, f"{REPO}@{c2}", tmp_path / "cache"))


def test_gc_of_the_source_keeps_every_object_the_new_commit_reads(
    local_hub, store, tmp_path, policies
):
    c1, c2, _, _ = two_commits(local_hub, store, tmp_path)
    old_shard2 = f"models/{REPO}/{c1}/{SHARD2}"
    # `k3a gc --keep 0 --keep-days 0 --apply`, for c1 alone (both are unreachable).
    policy = load_gate_policy(policies)
    verdicts = {v.commit: v for v in plan(store, policy, keep=0, keep_days=0)}
    assert {c: v.action for c, v in verdicts.items()} == {c1: "retire", c2: "retire"}
    assert retire(store, verdicts[c1], policy, who="test").action == "retired"
    assert store.list_revisions(REPO) == [c2]
    report = verify_revision(store=store, repo_id=REPO, commit=c2, full=True)
    assert report.ok, report.problems
    pulled_matches(local_hub, c2, pull(store, f"{REPO}@{c2}", tmp_path / "cache"))
    # What no kept revision reads is gone: c1's version of the changed shard.
    assert old_shard2 not in store.list_keys(f"models/{REPO}/{c1}/")
    invoke("verify", f"{REPO}@{c2}", "--store", store.url, "--full")


@pytest.mark.s3
def test_binding_a_tuple_materializes_the_prefix_then_gc_frees_the_source(
    local_hub, seaweed_store, tmp_path
):
    store = seaweed_store
    c1, c2, _, _ = two_commits(local_hub, store, tmp_path)
    manifest = store.read_manifest(REPO, c2)
    prefix = f"models/{REPO}/{c2}/"
    assert prefix + SHARD1 not in store.object_sizes(prefix)  # read from c1's objects
    # What the artifact gate compares with the manifest: the objects the revision reads.
    assert store.read_sizes(REPO, c2) == {r.path: r.size for r in manifest.files}
    spec = Releases(store, tmp_path / "scratch").tuple_for(manifest).binding
    binding = bind(store, REPO, c2, spec.image, spec.serving)
    assert binding.weights.location == f"{store.url}/{prefix.rstrip('/')}"
    assert store.materialize(REPO, c2) == 0  # bind copied them in
    listed = store.object_sizes(prefix)
    for record in manifest.files:
        assert listed[prefix + record.path] == record.size
    store.delete_revision(REPO, c1)
    assert store.list_keys(f"models/{REPO}/{c1}/") == []  # nothing of c1 is read any more
    assert verify_revision(store=store, repo_id=REPO, commit=c2, full=True).ok


@pytest.mark.s3
def test_a_source_retired_before_commit_is_refused_and_nothing_published(
    seaweed_store, tmp_path
):
    store = seaweed_store
    shard = os.urandom(1 << 20)
    c1, c2 = "1" * 40, "2" * 40
    rev1 = write_revision(tmp_path / "r1", {"model.safetensors": shard, "config.json": b"{}"})
    publish(store, c1, rev1)
    rev2 = write_revision(tmp_path / "r2", {"config.json": b'{"v": 2}'})
    writer = store.begin_revision(WRITER_REPO, c2)
    writer.put_file(*rev2["config.json"])
    record = rev1["model.safetensors"][0].model_copy(
        update={"source": "reused", "reused_from": c1})
    writer.reuse(record, c1, "model.safetensors")
    store.delete_revision(WRITER_REPO, c1)
    with pytest.raises(Conflict, match="retired"):
        writer.commit(manifest_for(c2, {**rev2, "model.safetensors": (record, None)}))
    assert store.list_revisions(WRITER_REPO) == []
    assert store.read(f"models/{WRITER_REPO}/{c2}/{OBJECT_RECORDS_REL}") is None


@pytest.mark.s3
def test_gc_racing_a_commit_that_references_it_never_breaks_what_is_published(
    seaweed_store, tmp_path
):
    """Each round: a writer commits a revision reading the source's objects while the source
    is deleted. Either the commit is refused, or it is published and reads whole."""
    store = seaweed_store
    shard = os.urandom(1 << 20)
    rev1 = write_revision(tmp_path / "r1", {"model.safetensors": shard})
    outcomes = []
    for n in range(6):
        c1, c2 = f"{2 * n + 1:040x}", f"{2 * n + 2:040x}"
        publish(store, c1, rev1)
        rev2 = write_revision(tmp_path / f"r2-{n}", {"config.json": f'{{"n": {n}}}'.encode()})
        writer = store.begin_revision(WRITER_REPO, c2)
        writer.put_file(*rev2["config.json"])
        record = rev1["model.safetensors"][0].model_copy(
            update={"source": "reused", "reused_from": c1})
        writer.reuse(record, c1, "model.safetensors")
        manifest = manifest_for(c2, {**rev2, "model.safetensors": (record, None)})
        barrier = threading.Barrier(2, timeout=30)
        refused: list[Exception] = []

        def commit(writer=writer, manifest=manifest, barrier=barrier, refused=refused):
            barrier.wait()
            try:
                writer.commit(manifest)
            except Conflict as exc:
                refused.append(exc)

        def gc(c1=c1, barrier=barrier):
            barrier.wait()
            store.delete_revision(WRITER_REPO, c1)

        threads = [threading.Thread(target=commit), threading.Thread(target=gc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        published = store.read_manifest(WRITER_REPO, c2) is not None
        assert published != bool(refused), (n, refused)
        if published:
            report = verify_revision(store=store, repo_id=WRITER_REPO, commit=c2, full=True)
            assert report.ok, (n, report.problems)
        outcomes.append(published)
    assert store.list_revisions(WRITER_REPO) == sorted(
        f"{2 * n + 2:040x}" for n, ok in enumerate(outcomes) if ok)


@pytest.mark.s3
def test_gc_between_a_commits_check_and_its_manifest_keeps_what_it_reads(
    seaweed_store, tmp_path, monkeypatch
):
    """The interleaving the protocol exists for: the writer found its source published, then
    gc deletes the source entirely before the writer's manifest lands. gc read the writer's
    object records (written first), so the published revision reads whole."""
    store = seaweed_store
    c1, c2 = "1" * 40, "2" * 40
    shard = os.urandom(1 << 20)
    rev1 = write_revision(tmp_path / "r1", {"model.safetensors": shard, "config.json": b"{}"})
    publish(store, c1, rev1)
    rev2 = write_revision(tmp_path / "r2", {"config.json": b'{"v": 2}'})
    writer = store.begin_revision(WRITER_REPO, c2)
    writer.put_file(*rev2["config.json"])
    record = rev1["model.safetensors"][0].model_copy(
        update={"source": "reused", "reused_from": c1})
    writer.reuse(record, c1, "model.safetensors")
    resume = tmp_path / "resume"
    monkeypatch.setenv("K3A_FAULT_PAUSE", f"references-checked@{c2}:60")
    monkeypatch.setenv("K3A_FAULT_RESUME", str(resume))
    committed = threading.Thread(target=writer.commit, args=(
        manifest_for(c2, {**rev2, "model.safetensors": (record, None)}),))
    paused = threading.Event()

    class Stderr(io.StringIO):  # the pause point announces itself on stderr
        def write(self, text: str) -> int:
            if "paused at references-checked" in text:
                paused.set()
            return super().write(text)

    monkeypatch.setattr(sys, "stderr", Stderr())
    committed.start()
    assert paused.wait(60), "the commit never reached its manifest"
    store.delete_revision(WRITER_REPO, c1)
    resume.touch()
    committed.join(60)
    assert store.list_revisions(WRITER_REPO) == [c2]
    report = verify_revision(store=store, repo_id=WRITER_REPO, commit=c2, full=True)
    assert report.ok, report.problems
    # c1's own config.json (not read by c2) is gone; its shard, which c2 reads, is kept.
    assert store.list_keys(f"models/{WRITER_REPO}/{c1}/") == [
        f"models/{WRITER_REPO}/{c1}/model.safetensors"]


def test_a_store_of_the_previous_layout_keeps_working(local_hub, store, tmp_path):
    """A revision published before references existed (object records without
    ``referenced_from``, every object under its own prefix) is read, reused from, retired
    and pulled from as before: the migration is that no stored byte needs to change."""
    files = small_release(tmp_path, shard_bytes=SHARD_BYTES, seed=0)
    c1 = local_hub.hub.add_commit(REPO, files)
    run_stage(local_hub.endpoint, store, tmp_path / "q")
    records_key = f"models/{REPO}/{c1}/{OBJECT_RECORDS_REL}"
    found = store.read(records_key)
    if found is not None:  # S3: rewrite the records as the previous release wrote them
        body = json.loads(found.data)
        for obj in body["objects"]:
            assert obj.pop("referenced_from") is None
        store.client.put_object(Bucket=store.bucket, Key=store.key(records_key),
                                Body=json.dumps(body).encode())
    pulled_matches(local_hub, c1, pull(store, f"{REPO}@{c1}", tmp_path / "cache1"))
    changed = {**files, SHARD2: small_release(tmp_path, shard_bytes=SHARD_BYTES, seed=1)[SHARD2]}
    c2 = local_hub.hub.add_commit(REPO, changed)
    second = run_stage(local_hub.endpoint, store, tmp_path / "q")
    assert second.store_stats.get("bytes_copied", 0) == 0
    store.delete_revision(REPO, c1)
    assert verify_revision(store=store, repo_id=REPO, commit=c2, full=True).ok
    pulled_matches(local_hub, c2, pull(store, f"{REPO}@{c2}", tmp_path / "cache2"))
