"""Incremental staging: a new upstream revision moves only the bytes that changed.

Against the local hub over HTTP, with the bytes counted at the hub (what it sent), for a file
store and for S3 (moto in server mode): what a revision pulls, what ``--plan`` says, reused
sources altered after publication, a source revision removed mid-run, two revisions at once,
and ``kill -9`` during an incremental run.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from k3artifacts.staging.engine import StageOptions, plan_stage, stage
from k3artifacts.staging.events import StageObserver
from k3artifacts.staging.hub import HubSource
from k3artifacts.stores.verify import verify_revision
from tests.faults.faultkit import stage_args, start_k3a, verified_paths
from tests.flow_helpers import resolve_gets
from tests.staging_helpers import FAST_RETRY, REPO, run_stage, small_release
from tests.support.cli import run_process

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store(request):
    return request.getfixturevalue("file_store" if request.param == "file" else "s3_store")


@pytest.fixture(params=["moto", "seaweedfs"])
def any_s3(request):
    """An S3 store on moto, and on SeaweedFS (a real server: it computes the checksums)."""
    return request.getfixturevalue("s3_store" if request.param == "moto" else "seaweed_store")


def hub_bytes(hub, since: int) -> int:
    """Bytes of file content the hub sent since request ``since``."""
    return sum(r.bytes_sent for r in hub.requests[since:]
               if r.is_file and r.method == "GET")


def first_revision(local_hub, store, tmp_path):
    files = small_release(tmp_path)
    commit = local_hub.hub.add_commit(REPO, files)
    run_stage(local_hub.endpoint, store, tmp_path / "q")
    return files, commit


def stage_next(local_hub, store, tmp_path, files, **options):
    commit = local_hub.hub.add_commit(REPO, files)
    mark = len(local_hub.hub.requests)
    result = run_stage(local_hub.endpoint, store, tmp_path / "q", **options)
    assert result.commit == commit
    return result, mark


def sources(store, commit) -> dict[str, str | None]:
    """path -> the commit its bytes were reused from (None: downloaded)."""
    manifest = store.read_manifest(REPO, commit).with_provenance(
        store.read_provenance(REPO, commit))
    return {r.path: r.reused_from for r in manifest.files}


def assert_pulled_only(local_hub, mark, result, store, first_commit, paths: set[str]):
    """The hub sent exactly ``paths`` (each once, whole) and everything else was reused."""
    files = local_hub.hub.files(REPO, result.commit)
    assert sorted(resolve_gets(local_hub.hub, mark)) == sorted(paths)
    pulled = sum(files[p].size for p in paths)
    assert hub_bytes(local_hub.hub, mark) == pulled == result.downloaded_bytes
    assert result.reused_bytes == result.total_bytes - pulled
    assert result.plan["download"] == {"files": len(paths), "bytes": pulled}
    assert result.plan["reuse"]["files"] == len(files) - len(paths)
    assert sources(store, result.commit) == {
        p: (None if p in paths else first_commit) for p in files}
    assert verify_revision(store=store, repo_id=REPO, commit=result.commit, full=True).ok


def test_changed_small_file_pulls_only_that_file(local_hub, store, tmp_path):
    _changed_small_file(local_hub, store, tmp_path)


@pytest.mark.s3
def test_changed_small_file_pulls_only_that_file_seaweedfs(local_hub, seaweed_store, tmp_path):
    _changed_small_file(local_hub, seaweed_store, tmp_path)


def _changed_small_file(local_hub, store, tmp_path):
    files, c1 = first_revision(local_hub, store, tmp_path)
    result, mark = stage_next(local_hub, store, tmp_path, {
        **files, "config.json": b'{"model_type": "kimi_k3", "n_routed_experts": 897}'})
    assert_pulled_only(local_hub, mark, result, store, c1, {"config.json"})
    assert result.reuse_fallbacks == []


def test_added_shard_pulls_only_that_shard_and_the_index(local_hub, store, tmp_path):
    files, c1 = first_revision(local_hub, store, tmp_path)
    shard3 = tmp_path / "model-00003-of-00003.safetensors"
    save_file({"layers.3.norm": np.arange(4096, dtype=np.float32)}, shard3)
    index = json.loads(files[INDEX])
    index["weight_map"]["layers.3.norm"] = shard3.name
    # A shard is added with the index naming it: the index is the one other file that changes.
    result, mark = stage_next(local_hub, store, tmp_path, {
        **files, shard3.name: shard3, INDEX: json.dumps(index).encode()})
    assert_pulled_only(local_hub, mark, result, store, c1, {shard3.name, INDEX})


def test_shard_changed_under_the_same_name_is_pulled(local_hub, store, tmp_path):
    files, c1 = first_revision(local_hub, store, tmp_path)
    other = small_release(tmp_path, seed=1)
    result, mark = stage_next(local_hub, store, tmp_path, {**files, SHARD1: other[SHARD1]})
    assert_pulled_only(local_hub, mark, result, store, c1, {SHARD1})


def test_plan_changes_nothing_and_matches_the_run(local_hub, store, tmp_path):
    files, c1 = first_revision(local_hub, store, tmp_path)
    c2 = local_hub.hub.add_commit(REPO, {**files, "config.json": b'{"v": 2}'})
    keys = store.list_keys("models/")
    mark = len(local_hub.hub.requests)
    source = HubSource(endpoint=local_hub.endpoint, token=False, retry=FAST_RETRY)
    plan = plan_stage(source, store, REPO, "main", tmp_path / "q")
    assert resolve_gets(local_hub.hub, mark) == [] and store.list_keys("models/") == keys
    assert {f.path for f in plan.of("download")} == {"config.json"}
    assert {(f.source_commit, f.source_path) for f in plan.of("reuse")} == {
        (c1, p) for p in files if p != "config.json"}

    result = run_stage(local_hub.endpoint, store, tmp_path / "q")
    assert result.commit == plan.commit == c2
    assert set(resolve_gets(local_hub.hub, mark)) == {f.path for f in plan.of("download")}
    assert result.plan == plan.summary()
    assert {p for p, src in sources(store, c2).items() if src} == {
        f.path for f in plan.of("reuse")}
    again = plan_stage(source, store, REPO, "main", tmp_path / "q")
    assert again.already_published and not again.of("download")


def test_plan_cli_prints_per_file_and_totals(local_hub, file_store, tmp_path, k3a_cmd, k3a_env):
    files, c1 = first_revision(local_hub, file_store, tmp_path)
    local_hub.hub.add_commit(REPO, {**files, "config.json": b'{"v": 2}'})
    args = stage_args(local_hub.endpoint, file_store, tmp_path / "q", "--plan")
    done = run_process(*args, "--json", env=k3a_env, cmd=k3a_cmd, expect=None)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    config = len(b'{"v": 2}')
    assert plan["totals"]["download"] == {"files": 1, "bytes": config}
    assert plan["totals"]["reuse"]["files"] == len(files) - 1
    assert {f["path"]: f["source_commit"] for f in plan["files"]} == {
        p: (None if p == "config.json" else c1) for p in files}
    human = run_process(*args, env=k3a_env, cmd=k3a_cmd, expect=None)
    assert human.returncode == 0, human.stderr
    assert f"from {c1}:{SHARD1}" in human.stdout
    assert f"download:       1 file(s) {config:>18,} bytes" in human.stdout
    assert len(file_store.list_revisions(REPO)) == 1


def test_altered_published_file_is_detected_and_downloaded_instead(local_hub, file_store, tmp_path):
    files, c1 = first_revision(local_hub, file_store, tmp_path)
    # As root: the published file replaced by other bytes of the same size.
    published = file_store.root / "models" / REPO / c1 / SHARD2
    size = published.stat().st_size
    tampered = published.with_name(".tampered")
    tampered.write_bytes(published.read_bytes()[:-8] + b"TAMPERED")
    os.replace(tampered, published)

    result, mark = stage_next(local_hub, file_store, tmp_path, {**files, "config.json": b"{}"},
                              reverify_reused=True)
    assert sorted(resolve_gets(local_hub.hub, mark)) == ["config.json", SHARD2]
    assert hub_bytes(local_hub.hub, mark) == 2 + size
    assert len(result.reuse_fallbacks) == 1 and SHARD2 in result.reuse_fallbacks[0]
    assert "xxh3-128" in result.reuse_fallbacks[0]
    assert sources(file_store, result.commit)[SHARD2] is None
    assert verify_revision(store=file_store, repo_id=REPO, commit=result.commit, full=True).ok


def test_truncated_published_file_is_caught_by_size_without_reverify(local_hub, file_store,
                                                                      tmp_path):
    files, c1 = first_revision(local_hub, file_store, tmp_path)
    published = file_store.root / "models" / REPO / c1 / SHARD2
    tampered = published.with_name(".tampered")
    tampered.write_bytes(published.read_bytes()[:-1])
    os.replace(tampered, published)
    result, mark = stage_next(local_hub, file_store, tmp_path, {**files, "config.json": b"{}"})
    assert sorted(resolve_gets(local_hub.hub, mark)) == ["config.json", SHARD2]
    assert "bytes" in result.reuse_fallbacks[0]
    assert verify_revision(store=file_store, repo_id=REPO, commit=result.commit, full=True).ok


@pytest.mark.s3
def test_s3_overwritten_source_is_copied_from_its_pinned_version(local_hub, any_s3, tmp_path):
    files, c1 = first_revision(local_hub, any_s3, tmp_path)
    key = any_s3.key(f"models/{REPO}/{c1}/{SHARD2}")
    head = any_s3.client.head_object(Bucket=any_s3.bucket, Key=key)
    any_s3.client.put_object(Bucket=any_s3.bucket, Key=key, Body=b"x" * head["ContentLength"],
                               Metadata=head["Metadata"])
    result, mark = stage_next(local_hub, any_s3, tmp_path, {**files, "config.json": b"{}"})
    assert resolve_gets(local_hub.hub, mark) == ["config.json"]
    assert sources(any_s3, result.commit)[SHARD2] == c1
    assert verify_revision(store=any_s3, repo_id=REPO, commit=result.commit, full=True).ok


@pytest.mark.s3
def test_s3_altered_source_fails_the_crc_check_and_is_downloaded(local_hub, any_s3, tmp_path):
    files, c1 = first_revision(local_hub, any_s3, tmp_path)
    key = any_s3.key(f"models/{REPO}/{c1}/{SHARD2}")
    head = any_s3.client.head_object(Bucket=any_s3.bucket, Key=key)
    # Other bytes, same size, the k3a metadata copied over: only the checksum S3 computes for
    # the copy can tell. The version the revision recorded is deleted, so nothing good is left.
    any_s3.client.put_object(Bucket=any_s3.bucket, Key=key, Body=b"x" * head["ContentLength"],
                               Metadata=head["Metadata"], ChecksumAlgorithm="CRC64NVME")
    any_s3.client.delete_object(Bucket=any_s3.bucket, Key=key, VersionId=head["VersionId"])
    result, mark = stage_next(local_hub, any_s3, tmp_path, {**files, "config.json": b"{}"})
    assert sorted(resolve_gets(local_hub.hub, mark)) == ["config.json", SHARD2]
    assert len(result.reuse_fallbacks) == 1 and "CRC64NVME" in result.reuse_fallbacks[0]
    assert sources(any_s3, result.commit)[SHARD2] is None
    assert verify_revision(store=any_s3, repo_id=REPO, commit=result.commit, full=True).ok


@pytest.mark.s3
def test_a_reused_shard_costs_one_ranged_read_of_its_header(local_hub, seaweed, seaweed_bucket,
                                                          seaweed_proxy, monkeypatch, tmp_path):
    """Checking a reused shard reads its header and nothing else of the object: one ranged GET
    of the length and the header (its length recorded at the first staging), where a GET of
    the whole object started sending all of a multi-GB shard to read a few KB. Every request
    is logged by a proxy in front of SeaweedFS, with its Range and the bytes sent back."""
    from k3artifacts.stores.s3 import MiB, S3Store, TransferTuning

    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    store = S3Store.from_url(f"s3://{seaweed_bucket}/k3a", endpoint_url=seaweed_proxy.endpoint,
                             tuning=TransferTuning(stream_part_size=5 * MiB, max_concurrency=2))
    files = small_release(tmp_path, shard_bytes=12 * MiB)
    local_hub.hub.add_commit(REPO, files)
    c1 = run_stage(local_hub.endpoint, store, tmp_path / "q").commit
    mark = len(seaweed_proxy.requests)
    result, _ = stage_next(local_hub, store, tmp_path, {**files, "config.json": b"{}"})
    assert sources(store, result.commit)[SHARD1] == sources(store, result.commit)[SHARD2] == c1
    manifest = store.read_manifest(REPO, c1)
    for shard in (SHARD1, SHARD2):
        header = manifest.file(shard).safetensors.header_len
        reads = [(r.range, r.body_bytes) for r in seaweed_proxy.requests[mark:]
                 if r.key.endswith(f"/{shard}") and r.method == "GET"]
        assert reads == [(f"bytes=0-{header + 7}", header + 8)], (shard, reads)
    assert verify_revision(store=store, repo_id=REPO, commit=result.commit, full=True).ok


class _DeleteOnPlan(StageObserver):
    """Deletes the source revision once the run has planned to reuse from it."""

    def __init__(self, store, commit):
        self.store, self.commit = store, commit

    def planned(self, files, reused, plan=None):
        assert plan is not None and plan.of("reuse")
        self.store.delete_revision(REPO, self.commit)


def test_source_revision_removed_mid_run_falls_back_to_download(local_hub, store, tmp_path):
    files, c1 = first_revision(local_hub, store, tmp_path)
    c2 = local_hub.hub.add_commit(REPO, {**files, "config.json": b"{}"})
    mark = len(local_hub.hub.requests)
    source = HubSource(endpoint=local_hub.endpoint, token=False, retry=FAST_RETRY)
    result = stage(source, store, REPO, "main", tmp_path / "q", StageOptions(retry=FAST_RETRY),
                   _DeleteOnPlan(store, c1))
    assert result.commit == c2 and store.list_revisions(REPO) == [c2]
    assert verify_revision(store=store, repo_id=REPO, commit=c2, full=True).ok
    # Its record of object versions went with it (S3), so no source is left: all downloaded.
    assert sorted(resolve_gets(local_hub.hub, mark)) == sorted(files)
    assert len(result.reuse_fallbacks) == len(files) - 1
    assert all("gone" in reason for reason in result.reuse_fallbacks)
    assert set(sources(store, c2).values()) == {None}


class _DownloadSeen(StageObserver):
    def __init__(self):
        self.downloaded = threading.Event()

    def file_done(self, record, reused):
        if not reused:
            self.downloaded.set()


def _before_each_reuse(monkeypatch, store, hold) -> None:
    """Every revision writer ``store`` opens calls ``hold()`` before each reuse."""
    begin = store.begin_revision

    def begin_revision(repo_id, commit):
        writer = begin(repo_id, commit)
        reuse = writer.reuse

        def held(*args, **kwargs):
            hold()
            return reuse(*args, **kwargs)

        writer.reuse = held
        return writer

    monkeypatch.setattr(store, "begin_revision", begin_revision)


def test_downloads_do_not_wait_for_the_reuses(local_hub, store, tmp_path, monkeypatch):
    """Each reuse is held until a download has finished: a run that reused every file before
    downloading any would wait here in vain (issue 22: a one-shard commit's transfer starts
    at once, its unchanged files are taken meanwhile)."""
    files, c1 = first_revision(local_hub, store, tmp_path)
    local_hub.hub.add_commit(REPO, {**files, "config.json": b"{}"})
    observer = _DownloadSeen()

    def after_a_download():
        assert observer.downloaded.wait(10), "no download finished while files were reused"

    _before_each_reuse(monkeypatch, store, after_a_download)
    source = HubSource(endpoint=local_hub.endpoint, token=False, retry=FAST_RETRY)
    result = stage(source, store, REPO, "main", tmp_path / "q", StageOptions(retry=FAST_RETRY),
                   observer)
    assert result.downloaded_bytes == 2 and result.reused_files == len(files) - 1
    assert set(sources(store, result.commit).values()) == {None, c1}
    assert verify_revision(store=store, repo_id=REPO, commit=result.commit, full=True).ok


def test_reuses_are_not_limited_to_the_download_workers(local_hub, store, tmp_path,
                                                       monkeypatch):
    """Every reuse of the commit waits at a barrier of all of them, with 2 download workers
    (what a 2-core machine gets): a reuse pool sized like the workers never fills it. A reuse
    is a few small requests; two at a time made a one-shard commit on 2 cores wait on its
    unchanged files after the shard had arrived (issue 22)."""
    files, c1 = first_revision(local_hub, store, tmp_path)
    local_hub.hub.add_commit(REPO, {**files, "config.json": b"{}"})
    barrier = threading.Barrier(len(files) - 1, timeout=20)
    _before_each_reuse(monkeypatch, store, barrier.wait)
    source = HubSource(endpoint=local_hub.endpoint, token=False, retry=FAST_RETRY)
    result = stage(source, store, REPO, "main", tmp_path / "q",
                   StageOptions(workers=2, retry=FAST_RETRY))
    assert not barrier.broken
    assert result.reused_files == len(files) - 1 and not result.reuse_fallbacks
    assert verify_revision(store=store, repo_id=REPO, commit=result.commit, full=True).ok


def test_two_revisions_sharing_shards_staged_at_once(local_hub, store, tmp_path):
    files, c1 = first_revision(local_hub, store, tmp_path)
    c2 = local_hub.hub.add_commit(REPO, {**files, "config.json": b'{"v": 2}'}, branch="b2")
    c3 = local_hub.hub.add_commit(REPO, {**files, "config.json": b'{"v": 3}'}, branch="b3")
    results, errors = {}, []

    def run(branch):
        try:
            results[branch] = run_stage(local_hub.endpoint, store, tmp_path / "q", revision=branch)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(b,)) for b in ("b2", "b3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert store.list_revisions(REPO) == sorted([c1, c2, c3])
    for commit in (c2, c3):
        assert verify_revision(store=store, repo_id=REPO, commit=commit, full=True).ok
        assert sources(store, commit)[SHARD1] == c1


def test_kill9_during_incremental_run_then_rerun_completes(local_hub, file_store, tmp_path,
                                                           k3a_cmd, k3a_env):
    files, c1 = first_revision(local_hub, file_store, tmp_path)
    c2 = local_hub.hub.add_commit(REPO, {**files, "config.json": b"{}"})
    quarantine = tmp_path / "q"
    running = start_k3a(k3a_cmd, k3a_env, *stage_args(local_hub.endpoint, file_store, quarantine),
                        K3A_FAULT_PAUSE=f"reused@{SHARD2}:60")
    running.wait_line("paused at reused")
    running.kill9()
    assert file_store.list_revisions(REPO) == [c1]
    assert SHARD2 in verified_paths(quarantine, c2)  # logged as held by the store-side revision
    # Downloads run while files are reused: config.json may be verified before the kill.
    missing = [] if "config.json" in verified_paths(quarantine, c2) else ["config.json"]

    mark = len(local_hub.hub.requests)
    done = run_process(*stage_args(local_hub.endpoint, file_store, quarantine),
                       env=k3a_env, cmd=k3a_cmd, expect=None)
    assert done.returncode == 0, done.stderr
    assert resolve_gets(local_hub.hub, mark) == missing
    assert f"{2 * len(missing)} pulled from the Hub" in done.stdout
    assert sources(file_store, c2) == {p: (None if p == "config.json" else c1) for p in files}
    assert verify_revision(store=file_store, repo_id=REPO, commit=c2, full=True).ok


@pytest.mark.s3
def test_s3_kill9_during_incremental_run_then_rerun_completes(local_hub, s3_store, tmp_path,
                                                              k3a_cmd, s3_env):
    files, c1 = first_revision(local_hub, s3_store, tmp_path)
    c2 = local_hub.hub.add_commit(REPO, {**files, "config.json": b"{}"})
    quarantine = tmp_path / "q2"
    runner = [k3a_cmd[0], "-m", "tests.faults.stage_runner", s3_store.url, local_hub.endpoint,
              str(quarantine)]
    running = start_k3a(runner, s3_env, K3A_FAULT_PAUSE=f"reused@{SHARD1}:60")
    running.wait_line("paused at reused")
    running.kill9()
    assert s3_store.list_revisions(REPO) == [c1]
    # Downloads run while files are reused: config.json may be verified before the kill.
    missing = [] if "config.json" in verified_paths(quarantine, c2) else ["config.json"]

    mark = len(local_hub.hub.requests)
    done = run_process(env=s3_env, cmd=runner, expect=None)
    assert done.returncode == 0, done.stderr
    assert resolve_gets(local_hub.hub, mark) == missing
    assert sources(s3_store, c2) == {p: (None if p == "config.json" else c1) for p in files}
    assert verify_revision(store=s3_store, repo_id=REPO, commit=c2, full=True).ok


def test_old_manifests_keep_their_digest():
    from k3artifacts.revisions.manifest import ShardManifest

    record = {"path": "config.json", "size": 2, "kind": "config", "sha256": "a" * 64,
              "xxh3_128": "b" * 32, "upstream_sha256": None, "upstream_git_oid": "c" * 40,
              "safetensors": None}
    old = {"schema_version": 1, "repo_id": REPO, "commit": "d" * 40, "files": [record],
           "license": {"path": None, "sha256": None, "text": None, "card_license": None,
                       "card_license_name": None, "card_license_link": None},
           "remote_code": [], "total_bytes": 2}
    raw = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    manifest = ShardManifest.parse(raw)
    assert manifest.files[0].source == "downloaded"
    assert manifest.canonical() == raw
    assert manifest.digest() == manifest.legacy_digest() == hashlib.sha256(raw).hexdigest()
    reused = manifest.files[0].model_copy(update={"source": "reused", "reused_from": "e" * 40})
    as_reused = manifest.model_copy(update={"files": [reused]})
    assert as_reused.digest() == manifest.digest()
    assert as_reused.canonical() == raw


def _legacy_bytes(manifest) -> bytes:
    """The manifest as it was published before provenance moved out: ``source`` and
    ``reused_from`` inside the records of reused files."""
    data = json.loads(manifest.canonical())
    for plain, record in zip(data["files"], manifest.files, strict=True):
        if record.source == "reused":
            plain.update(source="reused", reused_from=record.reused_from)
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def test_same_commit_fresh_and_by_reuse_has_one_digest(local_hub, file_store, tmp_path,
                                                      k3a_cmd, k3a_env):
    from k3artifacts.stores.file import FileStore

    files, c1 = first_revision(local_hub, file_store, tmp_path)
    result, _ = stage_next(local_hub, file_store, tmp_path, {
        **files, "config.json": b'{"model_type": "kimi_k3", "n_routed_experts": 897}'})
    c2 = result.commit
    fresh = FileStore(tmp_path / "fresh")
    assert run_stage(local_hub.endpoint, fresh, tmp_path / "q-fresh", revision=c2).commit == c2

    by_reuse, downloaded = file_store.read_manifest(REPO, c2), fresh.read_manifest(REPO, c2)
    assert by_reuse.digest() == downloaded.digest() == result.manifest_digest
    assert (file_store.local_path(f"models/{REPO}/{c2}/.k3a/manifest.json").read_bytes()
            == fresh.local_path(f"models/{REPO}/{c2}/.k3a/manifest.json").read_bytes())
    # Where the bytes came from is kept beside the manifest, store by store.
    assert {p.source for p in file_store.read_provenance(REPO, c2).files} == {
        "downloaded", "reused"}
    assert {p.source for p in fresh.read_provenance(REPO, c2).files} == {"downloaded"}
    assert sources(file_store, c2) == {p: (None if p == "config.json" else c1) for p in files}

    for store in (file_store, fresh):
        checked = run_process("verify", f"{REPO}@{c2}", "--store", store.url,
                              "--expect-digest", downloaded.digest(), "--json",
                              env=k3a_env, cmd=k3a_cmd, expect=None)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert json.loads(checked.stdout)["manifest_digest"] == downloaded.digest()


def test_manifest_with_provenance_inside_still_verifies(local_hub, file_store, tmp_path,
                                                        k3a_cmd, k3a_env):
    """A revision published before provenance moved out: its bytes carry ``source: reused``.
    It verifies by its canonical digest and by the digest a tuple bound then cites."""
    files, c1 = first_revision(local_hub, file_store, tmp_path)
    result, _ = stage_next(local_hub, file_store, tmp_path, {**files, "config.json": b"{}"})
    c2 = result.commit
    revision = file_store.local_path(f"models/{REPO}/{c2}")
    published = file_store.read_manifest(REPO, c2).with_provenance(
        file_store.read_provenance(REPO, c2))
    legacy = _legacy_bytes(published)
    assert b'"source":"reused"' in legacy
    for path in (revision / ".k3a", revision / ".k3a" / "manifest.json"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    (revision / ".k3a" / "manifest.json").write_bytes(legacy)
    (revision / ".k3a" / "provenance.json").unlink()

    old = file_store.read_manifest(REPO, c2)
    cited = hashlib.sha256(legacy).hexdigest()
    assert old.legacy_digest() == cited != old.digest() == published.digest()
    assert old.answers_to(cited) and old.answers_to(old.digest())
    assert {f.reused_from for f in old.files if f.path != "config.json"} == {c1}
    for digest in (cited, old.digest()):
        checked = run_process("verify", f"{REPO}@{c2}", "--store", file_store.url,
                              "--expect-digest", digest, "--full", "--json",
                              env=k3a_env, cmd=k3a_cmd, expect=None)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert json.loads(checked.stdout)["manifest_digest"] == old.digest()
    other = run_process("verify", f"{REPO}@{c2}", "--store", file_store.url,
                        "--expect-digest", "0" * 64, "--json",
                        env=k3a_env, cmd=k3a_cmd, expect=None)
    assert other.returncode != 0


def test_reuse_shares_the_inode_on_one_file_system_and_copies_across(tmp_path):
    from k3artifacts.stores.file import _share_or_copy

    src = tmp_path / "published.bin"
    src.write_bytes(os.urandom(3 << 20))
    assert _share_or_copy(src, tmp_path / "linked.bin") == "link"
    assert os.stat(tmp_path / "linked.bin").st_ino == src.stat().st_ino
    if os.stat("/dev/shm").st_dev == src.stat().st_dev:
        pytest.skip("/dev/shm is on the same file system as tmp_path here")
    other = Path("/dev/shm") / f"k3a-test-{os.getpid()}.bin"
    try:
        assert _share_or_copy(src, other) in ("copy_file_range", "copy")
        assert other.read_bytes() == src.read_bytes()
        assert other.stat().st_ino != src.stat().st_ino
    finally:
        other.unlink(missing_ok=True)


def test_racing_run_that_reused_other_files_accepts_the_published_manifest(store, tmp_path):
    from k3artifacts.errors import Conflict
    from tests.support.revisions import REPO as TEST_REPO
    from tests.support.revisions import publish, write_revision

    commit = "c" * 40
    _, published = publish(store, commit, write_revision(
        tmp_path / "r", {"a.bin": b"a" * 100, "b.bin": b"b" * 100}))
    a, b = published.files
    reused = published.model_copy(update={"files": [
        a.model_copy(update={"source": "reused", "reused_from": "f" * 40}), b]})
    assert reused.digest() == published.digest()
    store.begin_revision(TEST_REPO, commit).commit(reused)  # same weights: no conflict
    assert store.read_manifest(TEST_REPO, commit) == published
    other = published.model_copy(update={"files": [a.model_copy(update={"sha256": "0" * 64}), b]})
    with pytest.raises(Conflict):
        store.begin_revision(TEST_REPO, commit).commit(other)
