"""`k3a stage --repair`: a published file damaged in the store is fetched again from the hub,
checked against the manifest and put back; the revision keeps its manifest digest."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.flow_helpers import resolve_gets
from tests.staging_helpers import REPO, run_stage, small_release
from tests.support.cli import run_process

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def file_or_s3_store(request):
    return request.getfixturevalue("file_store" if request.param == "file" else "s3_store")


def _damage(store, commit: str) -> None:
    """What rots in a store: a flipped byte under a tree, a lost object version on S3."""
    from k3artifacts.stores.s3 import S3Store

    if isinstance(store, S3Store):
        (record,) = [r for r in store.object_records(REPO, commit).values() if r.path == SHARD]
        store.client.delete_object(Bucket=store.bucket, Key=store.key(record.key),
                                   VersionId=record.version_id)
        return
    path = store.local_path(f"models/{REPO}/{commit}/{SHARD}")
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(4096)
        byte = fh.read(1)
        fh.seek(4096)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_repair_puts_back_the_damaged_file_with_the_same_digest(
        request, local_hub, file_or_s3_store, tmp_path, k3a_cmd, k3a_env):
    from k3artifacts.stores.s3 import S3Store

    env = request.getfixturevalue("s3_env") if isinstance(file_or_s3_store, S3Store) else k3a_env
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    digest = run_stage(local_hub.endpoint, file_or_s3_store, tmp_path / "q").manifest_digest
    _damage(file_or_s3_store, commit)

    def k3a(*args: str):
        return run_process(*args, "--store", file_or_s3_store.url, env=env, cmd=k3a_cmd, expect=None)

    broken = k3a("verify", f"{REPO}@{commit}", "--full")
    assert broken.returncode == 4 and SHARD in broken.stdout + broken.stderr
    assert "--repair" in broken.stderr  # the advice leads somewhere
    # One problem per damaged file, with every reason it fails for: on S3 its recorded
    # version is gone and the prefix serves nothing, two reasons for one file.
    assert re.search(r": 1 of \d+ file\(s\) do not match the manifest", broken.stderr)
    listed = k3a("verify", f"{REPO}@{commit}", "--full", "--json")
    (problem,) = json.loads(listed.stdout)["problems"]
    assert (problem["path"], problem["kind"]) == (SHARD, "file")
    if isinstance(file_or_s3_store, S3Store):
        assert problem["reason"] == ("missing; as served where the revision is placed: no "
                                     "current object under the prefix")
    again = k3a("stage", REPO, "--revision", commit, "--endpoint", local_hub.endpoint,
                "--quarantine", str(tmp_path / "q"), "-q")
    assert again.returncode == 0  # published: a plain re-stage changes nothing...
    assert k3a("verify", f"{REPO}@{commit}", "--full").returncode == 4

    mark = len(local_hub.hub.requests)
    repaired = k3a("stage", REPO, "--revision", commit, "--endpoint", local_hub.endpoint,
                   "--quarantine", str(tmp_path / "q"), "--repair", "--json")
    assert repaired.returncode == 0, repaired.stderr
    body = json.loads(repaired.stdout)
    assert list(body["repaired"]) == [SHARD] and body["manifest_digest"] == digest
    assert resolve_gets(local_hub.hub, mark) == [SHARD]  # ...--repair fetches only the damage
    ok = k3a("verify", f"{REPO}@{commit}", "--full", "--expect-digest", digest)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.match(r"ok: \d+ files, [\d,]+ bytes match \(sha256\)\nmanifest digest: "
                    + digest + "\n$", ok.stdout), ok.stdout
    assert file_or_s3_store.read_manifest(REPO, commit).digest() == digest

    nothing = k3a("stage", REPO, "--revision", commit, "--endpoint", local_hub.endpoint,
                  "--quarantine", str(tmp_path / "q"), "--repair", "--json")
    assert nothing.returncode == 0 and json.loads(nothing.stdout)["repaired"] == {}
