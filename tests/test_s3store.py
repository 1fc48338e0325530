"""S3Store against moto in server mode: boto3 and s3transfer make real HTTP requests."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from awscrt import checksums

from k3artifacts.errors import AlreadyExists, Conflict, NotFound, VerifyMismatch
from k3artifacts.revisions.manifest import manifest_key
from k3artifacts.stores.registry import open_store
from k3artifacts.stores.s3 import META_SHA256, META_XXH3, MiB, S3Store, TransferTuning
from tests.support.revisions import REPO, manifest_for, publish, record_for, write_revision
from tests.support.waiting import wait_until

pytestmark = pytest.mark.s3

C1 = "1" * 40
C2 = "2" * 40


def crc64(data: bytes) -> str:
    return base64.b64encode(checksums.crc64nvme(data).to_bytes(8, "big")).decode()


# ---- small records ---------------------------------------------------------------------------


def test_create_is_exclusive(s3_store: S3Store) -> None:
    s3_store.create("releases/tuples/t1.json", b'{"a":1}')
    with pytest.raises(AlreadyExists):
        s3_store.create("releases/tuples/t1.json", b'{"a":2}')
    assert s3_store.read("releases/tuples/t1.json").data == b'{"a":1}'


def test_replace_compare_and_swap(s3_store: S3Store) -> None:
    key = "releases/channels/production.json"
    assert s3_store.read(key) is None
    t1 = s3_store.replace(key, b"v1", None)
    with pytest.raises(Conflict):  # expected absent, but it exists now: 412 on If-None-Match
        s3_store.replace(key, b"v1b", None)
    assert s3_store.read(key).token == t1
    t2 = s3_store.replace(key, b"v2", t1)
    assert t2 != t1
    with pytest.raises(Conflict):  # stale token: 412 on If-Match
        s3_store.replace(key, b"v3", t1)
    assert s3_store.read(key) == type(s3_store.read(key))(b"v2", t2)
    with pytest.raises(Conflict):  # a token for a key that does not exist
        s3_store.replace("releases/channels/staging.json", b"x", t2)


def test_list_keys_paginates_and_strips_prefix(s3_store: S3Store, s3_client, s3_bucket) -> None:
    s3_store.list_page_size = 2  # five keys: three ListObjectsV2 pages
    for i in (4, 0, 3, 1, 2):
        s3_client.put_object(Bucket=s3_bucket, Key=f"k3a/releases/history/{i:05d}.json", Body=b"")
    s3_client.put_object(Bucket=s3_bucket, Key="other/releases/history/x.json", Body=b"")
    assert s3_store.list_keys("releases/history/") == [
        f"releases/history/{i:05d}.json" for i in range(5)
    ]


def test_open_store_dispatches_s3(s3_url: str, moto_endpoint: str, monkeypatch) -> None:
    monkeypatch.setenv("K3A_S3_ENDPOINT_URL", moto_endpoint)
    store = open_store(s3_url)
    assert isinstance(store, S3Store) and store.url == s3_url
    store.create("releases/tuples/x.json", b"{}")
    with pytest.raises(NotFound):
        store.open_read("releases/tuples/missing.json")


# ---- revisions -------------------------------------------------------------------------------


def test_upload_records_and_compares_checksums(s3_store: S3Store, s3_client, s3_bucket,
                                               tmp_path: Path) -> None:
    big = os.urandom(12 * MiB)  # above the 5 MiB test threshold: multipart, 3 parts
    small = b'{"architectures": ["KimiK3"]}'
    files = write_revision(tmp_path / "q", {"model-00001.safetensors": big, "config.json": small})
    seen: dict[str, int] = {}
    s3_store.progress = lambda path, n: seen.__setitem__(path, seen.get(path, 0) + n)
    writer, manifest = publish(s3_store, C1, files)

    for rel, data in (("model-00001.safetensors", big), ("config.json", small)):
        receipt = writer.receipts[rel]
        assert receipt.action == "uploaded"
        assert receipt.checksum_crc64nvme == crc64(data)  # what S3 returned == what we computed
        if len(data) > 5 * MiB:
            # moto reports ChecksumType only for multipart objects (real S3: always).
            assert receipt.checksum_type == "FULL_OBJECT"
        assert receipt.version_id
        head = s3_client.head_object(Bucket=s3_bucket, Key=f"k3a/models/{REPO}/{C1}/{rel}",
                                     ChecksumMode="ENABLED")
        assert head["ChecksumCRC64NVME"] == crc64(data)
        assert head["Metadata"][META_SHA256] == files[rel][0].sha256
        assert head["Metadata"][META_XXH3] == files[rel][0].xxh3_128
    assert writer.receipts["model-00001.safetensors"].etag.endswith('-3"')  # really multipart
    assert seen == {"model-00001.safetensors": len(big), "config.json": len(small)}
    assert writer.counters.bytes_uploaded == len(big) + len(small)

    assert s3_store.list_revisions(REPO) == [C1]
    assert s3_store.read_manifest(REPO, C1) == manifest
    with s3_store.open_read(f"models/{REPO}/{C1}/model-00001.safetensors") as body:
        assert body.read() == big
    assert s3_store.location(REPO, C1) == f"{s3_store.url}/models/{REPO}/{C1}"
    objects = s3_store.read(f"models/{REPO}/{C1}/.k3a/s3-objects.json")
    assert b'"manifest_sha256":"' + manifest.digest().encode() in objects.data


def test_revision_without_manifest_is_absent(s3_store: S3Store, tmp_path: Path) -> None:
    files = write_revision(tmp_path / "q", {"a.bin": b"a" * 1000})
    writer = s3_store.begin_revision(REPO, C1)
    for rec, local in files.values():
        writer.put_file(rec, local)
    assert s3_store.list_keys(f"models/{REPO}/{C1}/") == [f"models/{REPO}/{C1}/a.bin"]
    assert s3_store.list_revisions(REPO) == []
    assert s3_store.read_manifest(REPO, C1) is None
    writer.commit(manifest_for(C1, files))
    assert s3_store.list_revisions(REPO) == [C1]


def test_commit_identical_is_noop_different_conflicts(s3_store: S3Store, tmp_path: Path) -> None:
    files = write_revision(tmp_path / "q", {"a.bin": b"a" * 100, "b.bin": b"b" * 100})
    _, manifest = publish(s3_store, C1, files)
    token = s3_store.read(manifest_key(REPO, C1)).token
    again = s3_store.begin_revision(REPO, C1)
    again.commit(manifest)
    assert s3_store.read(manifest_key(REPO, C1)).token == token
    other = manifest_for(C1, {"a.bin": files["a.bin"]})
    with pytest.raises(Conflict):
        s3_store.begin_revision(REPO, C1).commit(other)


def test_commit_refuses_a_manifest_naming_missing_files(s3_store: S3Store, tmp_path: Path) -> None:
    files = write_revision(tmp_path / "q", {"a.bin": b"a" * 100, "b.bin": b"b" * 100})
    writer = s3_store.begin_revision(REPO, C1)
    writer.put_file(*files["a.bin"])
    with pytest.raises(Exception, match="b.bin"):
        writer.commit(manifest_for(C1, files))
    assert s3_store.list_revisions(REPO) == []


def test_changed_quarantine_file_is_refused(s3_store: S3Store, tmp_path: Path) -> None:
    files = write_revision(tmp_path / "q", {"a.bin": b"a" * 100})
    rec, local = files["a.bin"]
    local.write_bytes(b"b" * 100)  # same size, different bytes since the record was made
    with pytest.raises(VerifyMismatch):
        s3_store.begin_revision(REPO, C1).put_file(rec, local)
    assert s3_store.list_keys(f"models/{REPO}/") == []


def test_bytes_changed_during_upload_are_caught_by_the_checksum(
    s3_store: S3Store, s3_url: str, moto_endpoint: str, tmp_path: Path
) -> None:
    files = write_revision(tmp_path / "q", {"model.safetensors": os.urandom(15 * MiB)})
    rec, local = files["model.safetensors"]
    store = S3Store.from_url(s3_url, endpoint_url=moto_endpoint, tuning=TransferTuning(
        multipart_threshold=5 * MiB, min_part_size=5 * MiB, max_concurrency=1))
    tampered = []

    def tamper(path: str, n: int) -> None:
        if not tampered:  # while part 1 is in flight, overwrite the (unread) last part
            with open(local, "r+b") as fh:
                fh.seek(-4, os.SEEK_END)
                fh.write(b"\0\0\0\0")
            tampered.append(n)

    store.progress = tamper
    with pytest.raises(VerifyMismatch, match="CRC64NVME"):
        store.begin_revision(REPO, C1).put_file(rec, local)
    assert tampered and store.list_revisions(REPO) == []


def test_second_revision_references_unchanged_objects_then_materializes_them(
    s3_store: S3Store, tmp_path: Path
) -> None:
    shards = {f"model-0000{i}-of-00003.safetensors": os.urandom(6 * MiB) for i in (1, 2, 3)}
    rev1 = write_revision(tmp_path / "r1", {**shards, "config.json": b'{"v": 1}'})
    w1, _ = publish(s3_store, C1, rev1)
    assert w1.counters.objects_uploaded == 4

    changed = b'{"v": 2, "rope_scaling": null}'
    rev2 = write_revision(tmp_path / "r2", {"config.json": changed})
    w2 = s3_store.begin_revision(REPO, C2)
    rec, local = rev2["config.json"]
    w2.put_file(rec, local)
    reused = {}
    for name in shards:
        record = rev1[name][0].model_copy(update={"source": "reused", "reused_from": C1})
        reused[name] = (record, rev1[name][1])
        w2.reuse(record, C1, name)
    assert w2.counters.as_dict() == {
        "bytes_uploaded": len(changed),
        "bytes_copied": 0,
        "objects_uploaded": 1,
        "objects_copied": 0,
        "objects_skipped": 0,
        "objects_referenced": 3,
        "bytes_referenced": 3 * 6 * MiB,
    }
    pinned = {o["path"]: o["version_id"] for o in json.loads(
        s3_store.read(f"models/{REPO}/{C1}/.k3a/s3-objects.json").data)["objects"]}
    for name, data in shards.items():
        receipt = w2.receipts[name]
        assert receipt.action == "referenced" and receipt.referenced_from == C1
        assert receipt.copied_from == (
            f"{s3_store.url}/models/{REPO}/{C1}/{name}?versionId={pinned[name]}")
        assert receipt.checksum_crc64nvme == crc64(data)
        with w2.open_staged(name) as body:
            assert body.read() == data
    m2 = manifest_for(C2, {**rev2, **reused})
    w2.commit(m2)
    assert s3_store.list_revisions(REPO) == [C1, C2]
    published = s3_store.read_manifest(REPO, C2)
    assert published.canonical() == m2.canonical()  # identity only: provenance is beside it
    assert published.with_provenance(s3_store.read_provenance(REPO, C2)) == m2
    # Only the changed file lies under the new prefix until a server needs the rest there.
    assert sorted(s3_store.object_sizes(f"models/{REPO}/{C2}/")) == [
        f"models/{REPO}/{C2}/.k3a/manifest.json", f"models/{REPO}/{C2}/.k3a/provenance.json",
        f"models/{REPO}/{C2}/.k3a/s3-objects.json", f"models/{REPO}/{C2}/config.json"]

    assert s3_store.materialize(REPO, C2) == 3 * 6 * MiB
    for name, data in shards.items():
        with s3_store.open_read(f"models/{REPO}/{C2}/{name}") as body:
            assert body.read() == data
        head = s3_store.head(f"models/{REPO}/{C2}/{name}")
        assert head["ETag"].endswith('-2"')  # 6 MiB over 5 MiB parts: UploadPartCopy ran
        record = s3_store.object_records(REPO, C2)[name]
        assert record.key == f"models/{REPO}/{C2}/{name}" and record.crc64nvme == crc64(data)
    assert s3_store.materialize(REPO, C2) == 0


def test_rerun_keeps_objects_already_uploaded(s3_store: S3Store, tmp_path: Path) -> None:
    files = write_revision(tmp_path / "q", {"a.bin": os.urandom(6 * MiB), "b.bin": b"b" * 10})
    first = s3_store.begin_revision(REPO, C1)
    first.put_file(*files["a.bin"])  # then the run dies before b.bin and the commit
    second = s3_store.begin_revision(REPO, C1)
    for rec, local in files.values():
        second.put_file(rec, local)
    second.commit(manifest_for(C1, files))
    assert second.counters.objects_skipped == 1
    assert second.counters.bytes_uploaded == 10
    assert second.receipts["a.bin"].action == "kept"


def test_abort_drops_objects_and_multipart_uploads(s3_store: S3Store, s3_client, s3_bucket,
                                                   tmp_path: Path) -> None:
    files = write_revision(tmp_path / "q", {"a.bin": os.urandom(6 * MiB)})
    writer = s3_store.begin_revision(REPO, C1)
    writer.put_file(*files["a.bin"])
    # A multipart upload a concurrent part of this writer had started when it failed:
    s3_client.create_multipart_upload(Bucket=s3_bucket, Key=f"k3a/models/{REPO}/{C1}/b.bin")
    writer.abort()
    assert s3_store.list_keys(f"models/{REPO}/{C1}/") == []
    assert "Uploads" not in s3_client.list_multipart_uploads(Bucket=s3_bucket)
    assert writer.abort_leftovers == []
    assert s3_store.list_revisions(REPO) == []


def test_delete_revision(s3_store: S3Store, tmp_path: Path) -> None:
    files = write_revision(tmp_path / "q", {"a.bin": b"a"})
    publish(s3_store, C1, files)
    s3_store.delete_revision(REPO, C1)
    assert s3_store.list_revisions(REPO) == []
    assert s3_store.list_keys(f"models/{REPO}/{C1}/") == []
    with pytest.raises(NotFound):
        s3_store.delete_revision(REPO, C1)


def test_part_size_keeps_large_files_under_10000_parts() -> None:
    tuning = TransferTuning()
    GiB = 1024 * MiB
    assert tuning.part_size(5 * GiB) == 64 * MiB
    for size in (100 * GiB, 640 * GiB, 1024 * GiB, 5 * 1024 * GiB):
        part = tuning.part_size(size)
        assert -(-size // part) <= 10_000
        assert part % MiB == 0 and part <= 5 * GiB  # S3's largest part
    assert tuning.part_size(1024 * GiB) == 105 * MiB


def test_record_helper_matches_store_hash(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_bytes(b"hello")
    from k3artifacts.stores.s3 import crc64nvme_and_sha256

    crc, sha, size = crc64nvme_and_sha256(path)
    assert (crc, sha, size) == (crc64(b"hello"), record_for(path, "x").sha256, 5)


_KILLED_WRITER = """
import sys
from pathlib import Path
from k3artifacts.stores.s3 import MiB, S3Store, TransferTuning
from tests.support.revisions import REPO, record_for
url, endpoint, local = sys.argv[1:4]
store = S3Store.from_url(url, endpoint_url=endpoint, tuning=TransferTuning(
    multipart_threshold=5 * MiB, min_part_size=5 * MiB, max_concurrency=1,
    max_bandwidth=4 * MiB))  # slow enough to be killed mid-upload
writer = store.begin_revision(REPO, sys.argv[4])
writer.put_file(record_for(Path(local), "model.safetensors"), Path(local))
writer.commit(None)  # never reached
"""


def test_killed_upload_leaves_nothing_visible_and_is_cleaned(
    s3_store: S3Store, s3_url: str, moto_endpoint: str, s3_client, s3_bucket, tmp_path: Path
) -> None:
    import subprocess
    import sys

    files = write_revision(tmp_path / "q", {"model.safetensors": os.urandom(24 * MiB)})
    rec, local = files["model.safetensors"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, s3_url, moto_endpoint, str(local), C1],
        cwd=Path(__file__).resolve().parent.parent,
    )
    def a_part_landed():
        for upload in s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []):
            if s3_client.list_parts(Bucket=s3_bucket, Key=upload["Key"],
                                    UploadId=upload["UploadId"]).get("Parts"):
                return True
        return False

    try:
        wait_until(a_part_landed, "the writer to upload a part", timeout=60, proc=proc)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode < 0  # killed, not finished
    dangling = s3_client.list_multipart_uploads(Bucket=s3_bucket)["Uploads"]
    assert [u["Key"] for u in dangling] == [f"k3a/models/{REPO}/{C1}/model.safetensors"]
    assert s3_store.list_revisions(REPO) == []
    assert s3_store.read_manifest(REPO, C1) is None
    assert s3_store.list_keys(f"models/{REPO}/{C1}/") == []

    # The next run of the same revision clears the debris and publishes cleanly.
    assert s3_store.clean_incomplete(REPO, C1) == 1
    writer = s3_store.begin_revision(REPO, C1)
    assert "Uploads" not in s3_client.list_multipart_uploads(Bucket=s3_bucket)
    writer.put_file(rec, local)
    writer.commit(manifest_for(C1, files))
    assert s3_store.list_revisions(REPO) == [C1]
    assert writer.receipts["model.safetensors"].checksum_type == "FULL_OBJECT"
