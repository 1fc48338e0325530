"""Staging end to end: the real huggingface_hub client against a local hub on loopback."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from k3artifacts.errors import NotFound, ReleaseRefused, Unavailable
from k3artifacts.net.policy import RetryPolicy
from k3artifacts.stores.verify import verify_revision
from tests.staging_helpers import (
    LICENSE,
    REPO,
    raw_safetensors,
    run_stage,
    small_release,
)
from tests.support.hubfaults import Fault

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def quarantine(tmp_path):
    return tmp_path / "quarantine"


def assert_nothing_published(store):
    assert store.list_revisions(REPO) == []
    assert store.list_keys("models/") == []


def refusal_of(err: ReleaseRefused, path: str):
    matches = [r for r in err.refusals if r.path == path]
    assert matches, f"{path} not named in {err}"
    return matches[0]


def test_happy_path_publishes_verified_revision(local_hub, file_store, quarantine, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    result = run_stage(local_hub.endpoint, file_store, quarantine)

    assert result.commit == commit and not result.already_published
    manifest = file_store.read_manifest(REPO, commit)
    assert manifest.digest() == result.manifest_digest
    assert {f.path for f in manifest.files} >= {SHARD, "model.safetensors.index.json", "LICENSE"}
    shard = manifest.file(SHARD)
    assert shard.sha256 == shard.upstream_sha256
    assert shard.safetensors.tensor_count == 2
    # The license is the revision's file, bound by its sha256, not a copy in the manifest.
    assert manifest.license.path == "LICENSE" and manifest.license.text is None
    assert manifest.license.sha256 == hashlib.sha256(LICENSE).hexdigest()
    assert manifest.license.sha256 == manifest.file("LICENSE").sha256
    assert manifest.license.card_license_name == "modified-mit"
    assert [c.path for c in manifest.remote_code] == ["modeling_kimi_k3.py"]
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok
    # Each file was fetched exactly once, and quarantine is cleaned after publication.
    gets = [r.target for r in local_hub.hub.requests if "/resolve/" in r.url]
    assert sorted(gets) == sorted(f.path for f in manifest.files)
    assert not (quarantine / "moonshotai--Kimi-K3" / commit).exists()


def test_restaging_published_revision_is_a_noop(local_hub, file_store, quarantine, tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    first = run_stage(local_hub.endpoint, file_store, quarantine)
    before = len(local_hub.hub.requests)
    again = run_stage(local_hub.endpoint, file_store, quarantine)
    assert again.already_published and again.manifest_digest == first.manifest_digest
    assert all("/resolve/" not in r.url for r in local_hub.hub.requests[before:])


def test_tag_resolves_to_commit_once(local_hub, file_store, quarantine, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.add_tag(REPO, "v1.0", commit)
    result = run_stage(local_hub.endpoint, file_store, quarantine, revision="v1.0")
    assert result.commit == commit
    resolves = [r for r in local_hub.hub.requests if "/resolve/" in r.url]
    assert resolves and all(r.revision == commit for r in resolves)


def test_resume_after_dropped_connection(local_hub, file_store, quarantine, tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.faults.add(SHARD, Fault.drop(after_bytes=100_000))
    run_stage(local_hub.endpoint, file_store, quarantine)
    shard_gets = [r for r in local_hub.hub.requests
                  if r.target == SHARD and r.method == "GET" and r.is_file]
    assert len(shard_gets) == 2
    assert shard_gets[1].range.startswith("bytes=") and shard_gets[1].range != "bytes=0-"
    assert int(shard_gets[1].range[6:].split("-")[0]) >= 100_000 - (1 << 20)


def test_resume_across_processes_continues_partial_file(local_hub, file_store, quarantine, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    # First run: the connection drops after 100 kB and this run gives up at once.
    local_hub.hub.faults.add(SHARD, Fault.drop(after_bytes=100_000))
    with pytest.raises(Unavailable, match=SHARD):
        run_stage(local_hub.endpoint, file_store, quarantine, workers=2,
                  retry=RetryPolicy(attempts=1))
    assert_nothing_published(file_store)
    parts = list((quarantine / "moonshotai--Kimi-K3" / commit / "partial").glob("*.part"))
    assert parts and parts[0].stat().st_size > 0
    partial_size = parts[0].stat().st_size
    local_hub.hub.faults.clear()
    mark = len(local_hub.hub.requests)
    result = run_stage(local_hub.endpoint, file_store, quarantine)
    later = local_hub.hub.requests[mark:]
    assert [r.range for r in later if r.target == SHARD and r.is_file] == [
        f"bytes={partial_size}-"]
    # The other shard, verified by the first run, is not fetched again.
    assert all(r.target != "model-00002-of-00002.safetensors" for r in later)
    assert result.files == 7 and result.reused_files >= 1


def test_corrupted_byte_is_refused_and_nothing_published(local_hub, file_store, quarantine, tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.faults.add(SHARD, Fault.corrupt(offset=5000))
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    refusal = refusal_of(err.value, SHARD)
    assert refusal.rule == "sha256" and "upstream LFS sha256" in refusal.detail
    assert_nothing_published(file_store)
    assert not any(p.name.startswith(".staging") for p in file_store.root.rglob(".staging*"))


def test_truncated_upstream_body_is_retried_then_refused(local_hub, file_store, quarantine, tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.faults.add(SHARD, Fault.short(missing=10, times=None))
    with pytest.raises(Unavailable) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    assert SHARD in str(err.value) and "gave up after" in str(err.value)
    assert_nothing_published(file_store)


def test_truncated_safetensors_file_is_refused(local_hub, file_store, quarantine, tmp_path):
    files = small_release(tmp_path)
    files[SHARD] = files[SHARD].read_bytes()[:-100]
    local_hub.hub.add_commit(REPO, files)
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    refusal = refusal_of(err.value, SHARD)
    assert refusal.rule == "safetensors-header" and "data section" in refusal.detail
    assert_nothing_published(file_store)


@pytest.mark.parametrize(
    "content,reason",
    [
        (raw_safetensors({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4,
                         header_len=100 << 30), "exceeds"),
        (raw_safetensors({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                          "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}}, b"\0" * 12),
         "overlap"),
    ],
)
def test_malformed_header_is_refused(local_hub, file_store, quarantine, tmp_path, content, reason):
    files = small_release(tmp_path)
    files["extra.safetensors"] = content
    local_hub.hub.add_commit(REPO, files)
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    assert reason in refusal_of(err.value, "extra.safetensors").detail
    assert_nothing_published(file_store)


@pytest.mark.parametrize("bad_path,rule", [("../x", "unsafe-path"), ("pytorch_model.bin", "pickle")])
def test_listing_rules_refuse_before_any_download(local_hub, file_store, quarantine, tmp_path,
                                                   bad_path, rule):
    files = small_release(tmp_path)
    files[bad_path] = b"payload"
    local_hub.hub.add_commit(REPO, files)
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    assert refusal_of(err.value, bad_path).rule == rule
    assert not [r for r in local_hub.hub.requests if "/resolve/" in r.url]
    assert_nothing_published(file_store)


def test_index_pointing_at_missing_shard_is_refused(local_hub, file_store, quarantine, tmp_path):
    files = small_release(tmp_path)
    del files["model-00002-of-00002.safetensors"]
    local_hub.hub.add_commit(REPO, files)
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    assert "missing shard" in refusal_of(err.value, "model.safetensors.index.json").detail
    assert_nothing_published(file_store)


def test_unknown_repo_and_revision(local_hub, file_store, quarantine, tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    with pytest.raises(NotFound, match="revision not found"):
        run_stage(local_hub.endpoint, file_store, quarantine, revision="no-such-branch")


def test_verify_detects_a_flipped_byte(local_hub, file_store, quarantine, tmp_path, k3a_cmd, k3a_env):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    run_stage(local_hub.endpoint, file_store, quarantine)
    shard = file_store.local_path(f"models/{REPO}/{commit}/{SHARD}")
    os.chmod(shard, 0o644)
    with open(shard, "r+b") as fh:
        fh.seek(4242)
        byte = fh.read(1)
        fh.seek(4242)
        fh.write(bytes([byte[0] ^ 1]))

    report = verify_revision(store=file_store, repo_id=REPO, commit=commit)
    assert [p.path for p in report.problems] == [SHARD]
    proc = subprocess.run(
        [*k3a_cmd, "verify", f"{REPO}@{commit}", "--store", file_store.url, "-q"],
        env=k3a_env, capture_output=True, text=True,
    )
    assert proc.returncode == 4, proc.stderr
    assert SHARD in proc.stderr and "xxh3-128" in proc.stderr
    by_dir = subprocess.run(
        [*k3a_cmd, "verify", str(shard.parent), "--full", "--json"],
        env=k3a_env, capture_output=True, text=True,
    )
    assert by_dir.returncode == 4 and f'"path": "{SHARD}"' in by_dir.stdout


def test_window_mode_stores_shards_and_frees_quarantine(local_hub, file_store, tmp_path):
    """With a window smaller than the checkpoint, shards leave quarantine once stored."""
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    quarantine = tmp_path / "local-nvme"
    result = run_stage(local_hub.endpoint, file_store, quarantine, window_bytes=300_000,
                       keep_quarantine=True)
    files = quarantine / "moonshotai--Kimi-K3" / commit / "files"
    assert not list(files.glob("*.safetensors"))
    assert (files / "model.safetensors.index.json").exists()
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok
    assert result.files == 7


def test_window_mode_resume_reuses_stored_shards(local_hub, file_store, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    quarantine = tmp_path / "q"
    second = "model-00002-of-00002.safetensors"
    local_hub.hub.faults.add(second, Fault.http_status(500, times=None))
    with pytest.raises(Unavailable, match=second):
        run_stage(local_hub.endpoint, file_store, quarantine, window_bytes=300_000, workers=1,
                  retry=RetryPolicy(attempts=1))
    assert_nothing_published(file_store)
    local_hub.hub.faults.clear()
    mark = len(local_hub.hub.requests)
    run_stage(local_hub.endpoint, file_store, quarantine, window_bytes=300_000)
    refetched = {r.target for r in local_hub.hub.requests[mark:] if "/resolve/" in r.url}
    assert SHARD not in refetched and second in refetched
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok


@pytest.mark.s3
def test_stage_to_s3_then_one_changed_file_uploads_only_that_file(local_hub, s3_store, tmp_path):
    from k3artifacts.localhub.synthetic import derive_revision, write_release

    files = write_release(tmp_path / "r1", total_bytes=12 << 20, shards=2, seed=3)
    first_commit = local_hub.hub.add_commit(REPO, files)
    first = run_stage(local_hub.endpoint, s3_store, tmp_path / "q")
    assert first.commit == first_commit
    assert first.store_stats["bytes_uploaded"] == first.total_bytes
    assert verify_revision(store=s3_store, repo_id=REPO, commit=first_commit, full=True).ok

    changed = derive_revision(files, tmp_path / "r2")
    second_commit = local_hub.hub.add_commit(REPO, changed)
    second = run_stage(local_hub.endpoint, s3_store, tmp_path / "q")
    assert second.commit == second_commit != first_commit
    new = s3_store.read_manifest(REPO, second_commit).with_provenance(
        s3_store.read_provenance(REPO, second_commit))
    old = s3_store.read_manifest(REPO, first_commit)
    as_downloaded = {"source": "downloaded", "reused_from": None}
    differing = [f for f in new.files if old.file(f.path) != f.model_copy(update=as_downloaded)]
    assert [f.path for f in differing] == ["generation_config.json"]
    assert {f.reused_from for f in new.files if f not in differing} == {first_commit}
    assert second.downloaded_bytes == differing[0].size
    assert second.store_stats["bytes_uploaded"] == differing[0].size
    assert second.store_stats.get("bytes_copied", 0) == 0
    assert second.store_stats["bytes_referenced"] == second.total_bytes - differing[0].size
    assert verify_revision(store=s3_store, repo_id=REPO, commit=second_commit).ok


@pytest.mark.s3
def test_s3_window_mode_resume_adopts_uploaded_shards(local_hub, s3_store, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    second = "model-00002-of-00002.safetensors"
    local_hub.hub.faults.add(second, Fault.http_status(500, times=None))
    with pytest.raises(Unavailable):
        run_stage(local_hub.endpoint, s3_store, tmp_path / "q", window_bytes=300_000, workers=1,
                  retry=RetryPolicy(attempts=1))
    assert s3_store.list_revisions(REPO) == []
    local_hub.hub.faults.clear()
    mark = len(local_hub.hub.requests)
    result = run_stage(local_hub.endpoint, s3_store, tmp_path / "q", window_bytes=300_000)
    refetched = {r.target for r in local_hub.hub.requests[mark:] if "/resolve/" in r.url}
    assert SHARD not in refetched and second in refetched
    assert result.store_stats["objects_skipped"] >= 1
    assert verify_revision(store=s3_store, repo_id=REPO, commit=commit, full=True).ok


def test_flaky_link_that_keeps_moving_bytes_is_not_given_up(local_hub, file_store, quarantine, tmp_path):
    """Every attempt drops after 64 kB; each makes progress, so two attempts are plenty."""
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.faults.add(SHARD, Fault.drop(after_bytes=64_000, times=None))
    run_stage(local_hub.endpoint, file_store, quarantine, retry=RetryPolicy(attempts=2, backoff=0))
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok
    ranges = [r.range for r in local_hub.hub.requests if r.target == SHARD and r.is_file]
    assert len(ranges) >= 4 and ranges[0] is None


def test_small_files_are_rehashed_before_reuse(local_hub, file_store, quarantine, tmp_path):
    """Small files skip the per-file fsync; after a crash their size and mtime could be right
    and their bytes not, so a re-run re-hashes them instead of trusting the log."""
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    # One worker takes files largest first: the smallest fails after the others verified.
    local_hub.hub.faults.add("modeling_kimi_k3.py", Fault.http_status(500, times=None))
    with pytest.raises(Unavailable):
        run_stage(local_hub.endpoint, file_store, quarantine, workers=1,
                  retry=RetryPolicy(attempts=1))
    config = quarantine / "moonshotai--Kimi-K3" / commit / "files" / "config.json"
    stat = config.stat()
    config.write_bytes(b"X" * stat.st_size)  # what a lost write-back can leave: same size
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    local_hub.hub.faults.clear()
    mark = len(local_hub.hub.requests)
    run_stage(local_hub.endpoint, file_store, quarantine)
    refetched = {r.target for r in local_hub.hub.requests[mark:] if "/resolve/" in r.url}
    assert "config.json" in refetched and "LICENSE" not in refetched
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok


@pytest.mark.parametrize("commit,path", [
    ("a" * 40, "model-00001-of-00002.safetensors"),
    ("b" * 40, "sub dir/ä#?.json"),
    ("refs/pr/1", "x/y+z.bin"),
])
def test_a_files_url_is_spelled_as_huggingface_hub_spells_it(commit, path):
    """k3a builds a file's /resolve/ URL itself (importing huggingface_hub's download module
    for it cost every stage's start 20-25 ms); the official client spells it the same."""
    from huggingface_hub import hf_hub_url

    from k3artifacts.staging.hub import HubSource

    endpoint = "http://127.0.0.1:8080"
    assert HubSource(endpoint=endpoint, token=False).file_url(REPO, commit, path) == hf_hub_url(
        REPO, path, revision=commit, endpoint=endpoint)
