"""Staging to S3 sends a shard while it downloads (issue 22): parts leave as they land in
quarantine, each byte is read back once, and the upload is completed only when the CRCs of the
parts sent combine to the CRC of the bytes verified. Against SeaweedFS on loopback; objects are
read back with boto3 and checked by their bytes."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import threading
from pathlib import Path

import pytest
from awscrt import checksums

from k3artifacts.revisions.hashing import MultiHasher
from k3artifacts.revisions.manifest import FileRecord
from k3artifacts.staging.download import Ranges, fetch
from k3artifacts.staging.hub import HubSource
from k3artifacts.stores.s3 import STREAM_LAG, MiB, S3Store, TransferTuning
from k3artifacts.stores.verify import verify_revision
from tests.faults.faultkit import SHARD1, start_k3a
from tests.staging_helpers import REPO, run_stage, small_release
from tests.support.cli import run_process
from tests.support.own_usage import launched, read_usage
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

#: Shards of 13 MiB with 5 MiB parts: two whole parts go out before the download ends.
SHARD_BYTES = 13 * MiB


def _crc(data: bytes) -> str:
    return base64.b64encode(checksums.crc64nvme(data).to_bytes(8, "big")).decode()


def _seaweed_store(seaweed, bucket: str, monkeypatch, *, multipart: int) -> S3Store:
    """The SeaweedFS store with 5 MiB stream parts, 2 in flight per file, and s3transfer's
    multipart threshold and part size at ``multipart``."""
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return S3Store.from_url(
        f"s3://{bucket}/k3a", endpoint_url=seaweed.endpoint,
        tuning=TransferTuning(multipart_threshold=multipart, min_part_size=multipart,
                              stream_part_size=5 * MiB, max_concurrency=2))


@pytest.fixture
def streaming_store(seaweed, seaweed_bucket, monkeypatch):
    """SeaweedFS with 5 MiB parts both ways: what a shard streams to in many parts."""
    return _seaweed_store(seaweed, seaweed_bucket, monkeypatch, multipart=5 * MiB)


def _bytes(files, path: str) -> bytes:
    value = files[path]
    return value.read_bytes() if isinstance(value, Path) else value


@pytest.mark.parametrize("ranges", [Ranges(streams=1), Ranges(streams=3, size=2 * MiB)],
                         ids=["one-stream", "ranges"])
def test_shards_stream_to_s3_once_and_read_back_whole(local_hub, streaming_store, tmp_path, ranges):
    """Parts leave as the file's whole prefix grows, whether one stream writes it front to
    back or several write ranges out of order."""
    files = small_release(tmp_path, shard_bytes=SHARD_BYTES)
    commit = local_hub.hub.add_commit(REPO, files)
    result = run_stage(local_hub.endpoint, streaming_store, tmp_path / "q", ranges=ranges)
    assert result.commit == commit
    total = sum(len(_bytes(files, p)) for p in files)
    # Every byte crossed to S3 once: no second upload of a shard after it was verified.
    assert streaming_store.counters.bytes_uploaded == total
    for path in files:
        want = _bytes(files, path)
        got = streaming_store.client.get_object(Bucket=streaming_store.bucket, Key=streaming_store.key(
            f"models/{REPO}/{commit}/{path}"), ChecksumMode="ENABLED")
        assert got["Body"].read() == want, path
        if path.endswith(".safetensors"):
            assert got["ChecksumCRC64NVME"] == _crc(want)
            assert got["ChecksumType"] == "FULL_OBJECT"
    assert verify_revision(store=streaming_store, repo_id=REPO, commit=commit, full=True).ok


def test_parts_read_before_the_bytes_were_right_are_not_completed(streaming_store, tmp_path):
    """Parts whose bytes are not the verified ones (read too early, or a download that started
    over) never become an object: the CRCs of the parts sent do not combine to the CRC of the
    bytes verified. Here the file held zeros while it was sent and the good bytes were verified
    elsewhere."""
    good = os.urandom(11 * MiB)
    local = tmp_path / "shard"
    local.write_bytes(b"\0" * len(good))
    record = FileRecord(path="w.safetensors", size=len(good), kind="weights",
                        sha256=hashlib.sha256(good).hexdigest(), xxh3_128="0" * 32)
    writer = streaming_store.begin_revision(REPO, "a" * 40)
    upload = writer.begin_put(record.path, record.size, record.sha256, local)
    upload.written(record.size + STREAM_LAG)  # both whole parts go out, zeros
    assert upload.finish(record, {"crc64nvme": _crc(good)}, local) is None
    key = streaming_store.key(f"models/{REPO}/{'a' * 40}/{record.path}")
    assert streaming_store.client.list_multipart_uploads(Bucket=streaming_store.bucket).get("Uploads", []) == []
    assert "Contents" not in streaming_store.client.list_objects_v2(Bucket=streaming_store.bucket, Prefix=key)
    # The caller's fallback: the verified file, whole.
    local.write_bytes(good)
    receipt = writer.put_file(record, local, checksums={"crc64nvme": _crc(good)})
    assert receipt.checksum_crc64nvme == _crc(good)
    assert streaming_store.client.get_object(Bucket=streaming_store.bucket, Key=key)["Body"].read() == good


def test_each_file_in_flight_gets_its_own_parts_in_flight(streaming_store, tmp_path, monkeypatch):
    """``max_concurrency`` is per file: three files put at once send six parts at once (one
    pool sized for one file kept every download waiting on its last parts). Every part waits
    at a barrier of six before it is sent: a pool with fewer threads never fills it. Parts go
    without a payload signature, their CRC64NVME header being the check, each in one block
    from its buffer."""
    writer = streaming_store.begin_revision(REPO, "b" * 40)
    writer.expect_files(3)
    barrier = threading.Barrier(6, timeout=30)
    client = writer.part_client()
    real = client.upload_part

    def upload_part(**kw):
        barrier.wait()
        return real(**kw)

    monkeypatch.setattr(client, "upload_part", upload_part)
    payloads, blocks, expects = [], [], []

    def sending(request, **_):
        payloads.append(request.headers.get("X-Amz-Content-SHA256"))
        expects.append(request.headers.get("Expect"))
        # What urllib3 reads of it for its first 16 KiB block: the whole part.
        blocks.append((len(request.body.read(16384)), int(request.headers["Content-Length"])))
        request.body.seek(0)

    client.meta.events.register("before-send.s3.UploadPart", sending)
    uploads = []
    for i in range(3):
        data = os.urandom(10 * MiB)
        local = tmp_path / f"shard{i}"
        local.write_bytes(data)
        record = FileRecord(path=f"w{i}.safetensors", size=len(data), kind="weights",
                            sha256=hashlib.sha256(data).hexdigest(), xxh3_128="0" * 32)
        upload = writer.begin_put(record.path, record.size, record.sha256, local)
        upload.written(record.size + STREAM_LAG)
        uploads.append((upload, record, data, local))
    for upload, record, data, local in uploads:
        receipt = upload.finish(record, {"crc64nvme": _crc(data)}, local)
        assert receipt is not None and receipt.checksum_crc64nvme == _crc(data)
    assert not barrier.broken
    # Plain HTTP to SeaweedFS, yet no SHA256 of each part's body: its signed CRC64NVME
    # header is the check (and the parts' CRCs combined, the end-to-end one).
    assert payloads and set(payloads) == {b"UNSIGNED-PAYLOAD"}, payloads
    # Each part leaves in one block from the buffer it was read into (not 16 KiB a call),
    # without waiting for a 100 Continue.
    assert blocks and all(got == whole == 5 * MiB for got, whole in blocks), blocks
    assert set(expects) == {None}, expects


def test_a_file_of_one_part_or_more_goes_as_parts_below_the_multipart_threshold(
        seaweed, seaweed_bucket, monkeypatch, tmp_path):
    """s3transfer's multipart threshold (64 MiB by default) does not decide which files we
    send as our own parts: one of at least a part streams, smaller ones are one PUT. A 63 MB
    shard went through s3transfer, whose signer hashed the whole file a second time over
    plain HTTP (issue 22)."""
    store = _seaweed_store(seaweed, seaweed_bucket, monkeypatch, multipart=64 * MiB)
    writer = store.begin_revision(REPO, "c" * 40)
    assert writer.begin_put("small", 5 * MiB - 1, "0" * 64, tmp_path / "x") is None
    for name, size in (("w.safetensors", 11 * MiB), ("tiny.json", 3 * MiB)):
        data = os.urandom(size)
        local = tmp_path / name
        local.write_bytes(data)
        record = FileRecord(path=name, size=size, kind="other",
                            sha256=hashlib.sha256(data).hexdigest(), xxh3_128="0" * 32)
        receipt = writer.put_file(record, local, checksums={"crc64nvme": _crc(data)})
        assert receipt.checksum_crc64nvme == _crc(data)
        head = store.client.head_object(Bucket=store.bucket, Key=store.key(
            f"models/{REPO}/{'c' * 40}/{name}"))
        parts = head["ETag"].strip('"').partition("-")[2]
        assert parts == ("3" if size > 5 * MiB else ""), (name, head["ETag"])


def test_killed_with_parts_sent_then_rerun_completes(local_hub, seaweed, seaweed_bucket,
                                                    tmp_path, k3a_env, k3a_cmd,
                                                     monkeypatch):
    """Killed after parts of a shard reached S3 (before the shard was verified): nothing is
    published, and the re-run aborts the stale upload, resumes and publishes the right bytes."""
    files = small_release(tmp_path, shard_bytes=SHARD_BYTES)
    commit = local_hub.hub.add_commit(REPO, files)
    env = dict(k3a_env, **seaweed.env,
               K3A_S3_PART_SIZE="5MiB")
    env.pop("AWS_SESSION_TOKEN", None)
    url = f"s3://{seaweed_bucket}/k3a"
    args = ["stage", REPO, "--endpoint", local_hub.endpoint, "--store", url,
            "--quarantine", str(tmp_path / "q"), "--retries", "3", "-q"]
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    store = S3Store.from_url(url, endpoint_url=seaweed.endpoint)
    client = store.client

    def parts_sent() -> int:
        uploads = client.list_multipart_uploads(Bucket=seaweed_bucket).get("Uploads", [])
        return sum(len(client.list_parts(Bucket=seaweed_bucket, Key=u["Key"],
                                         UploadId=u["UploadId"]).get("Parts", []))
                   for u in uploads if u["Key"].endswith(SHARD1))

    running = start_k3a(k3a_cmd, env, *args,
                        K3A_FAULT_PAUSE=f"downloaded@{SHARD1}:60")
    running.wait_line("paused at downloaded")
    # Sent while the shard downloaded: the parts are in S3 before it was even checked.
    wait_until(parts_sent, "parts of the shard in S3 before its verification", proc=running.proc)
    running.kill9()
    assert store.list_revisions(REPO) == []

    done = run_process(*args, env=env, cmd=k3a_cmd, expect=None)
    assert done.returncode == 0, done.stderr
    assert client.list_multipart_uploads(Bucket=seaweed_bucket).get("Uploads", []) == []
    key = store.key(f"models/{REPO}/{commit}/{SHARD1}")
    assert client.get_object(Bucket=seaweed_bucket, Key=key)["Body"].read() == _bytes(
        files, SHARD1)
    assert verify_revision(store=store, repo_id=REPO, commit=commit, full=True).ok


def _stage_peak_rss(k3a_cmd, env, args, log: Path) -> int:
    """Peak RSS of one ``k3a stage`` process: its own, not the test's (tests.support.own_usage)."""
    report = log.with_suffix(".usage")
    with open(log, "wb") as err:
        done = subprocess.run(launched([*k3a_cmd, *args], report), env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    assert done.returncode == 0, log.read_text()[-3000:]
    return read_usage(report).max_rss


def test_peak_memory_does_not_follow_the_shard_size(local_hub, seaweed, seaweed_bucket,
                                                    tmp_path, k3a_env, k3a_cmd):
    """Shards 8x bigger, same peak RSS (loosely): parts in flight are bounded buffers and the
    download streams through one, so a shard is never held in memory.

    The peaks are each ``k3a stage``'s own (tests.support.own_usage): read straight from wait4
    they were the test process's size at the fork, which grew with the release it had just
    written, and made this look like glibc keeping freed buffers. One stream per file: a file
    of more ranges is fetched over up to ``--streams`` connections, each a thread and a 1 MiB
    buffer, a bound of its own that a small shard does not reach and a big one does."""
    env = dict(k3a_env, **seaweed.env, K3A_S3_PART_SIZE="5MiB", K3A_S3_CONCURRENCY="2")
    env.pop("AWS_SESSION_TOKEN", None)
    url = f"s3://{seaweed_bucket}/k3a"
    peaks = {}
    # 12 MiB already keeps two 5 MiB parts in flight per file, as every bigger shard does.
    for shard_bytes, seed in ((12 * MiB, 1), (96 * MiB, 2)):
        local_hub.hub.add_commit(REPO, small_release(tmp_path, shard_bytes=shard_bytes,
                                                     seed=seed))
        peaks[shard_bytes] = _stage_peak_rss(k3a_cmd, env, [
            "stage", REPO, "--endpoint", local_hub.endpoint, "--store", url, "--streams", "1",
            "--quarantine", str(tmp_path / f"q{seed}"), "-q"], tmp_path / f"stage{seed}.log")
    small, big = peaks[12 * MiB], peaks[96 * MiB]
    # Holding a quarter of one 96 MiB shard (two are in flight) would add at least this much.
    assert big - small < 24 * MiB, peaks
    assert big <= small * 1.25, peaks


def test_part_buffers_are_bounded_in_bytes_across_files(local_hub, seaweed, seaweed_bucket,
                                                       tmp_path, k3a_env, k3a_cmd):
    """Eight files in flight, each allowed eight 5 MiB parts at once (320 MiB of buffers by
    parts times files), under a 20 MiB budget of part buffers: the peak stays within that
    budget of a one-file stage's (each ``k3a stage``'s own peak, tests.support.own_usage)."""
    env = dict(k3a_env, **seaweed.env, K3A_S3_PART_SIZE="5MiB", K3A_S3_CONCURRENCY="8",
               K3A_S3_BUFFER="20MiB")
    env.pop("AWS_SESSION_TOKEN", None)
    url = f"s3://{seaweed_bucket}/k3a"
    peaks = {}
    for shards, shard_bytes, seed in ((1, 6 * MiB, 1), (8, 40 * MiB, 2)):
        local_hub.hub.add_commit(REPO, small_release(tmp_path, shard_bytes=shard_bytes,
                                                     seed=seed, shards=shards))
        peaks[shards] = _stage_peak_rss(k3a_cmd, env, [
            "stage", REPO, "--endpoint", local_hub.endpoint, "--store", url, "--streams", "1",
            "--workers", "8", "--quarantine", str(tmp_path / f"q{seed}"), "-q"],
            tmp_path / f"stage{seed}.log")
    # The budget, a stream buffer per file, and slack for the allocator and threads: 40 MiB
    # over the one-file stage here; 337 MiB with the budget lifted.
    assert peaks[8] - peaks[1] < 20 * MiB + 8 * MiB + 40 * MiB, peaks


def test_the_upload_is_offered_landed_bytes_before_the_cursor_hashes_them(local_hub, tmp_path):
    """On one large file the hash cursor is the slowest stage: the streamed upload is offered
    each landed prefix before the cursor hashes it (the upload completes only once the file is
    verified), so sending and hashing overlap instead of following each other."""
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path, shard_bytes=1 << 20))
    size = local_hub.hub.files(REPO, commit)[SHARD1].size
    hashers: list[MultiHasher] = []

    def hasher() -> MultiHasher:
        hashers.append(MultiHasher())
        return hashers[-1]

    offered: list[tuple[int, int]] = []  # (prefix offered, bytes hashed at that moment)
    fetch(HubSource(local_hub.endpoint, token=False).file_url(REPO, commit, SHARD1), {},
          tmp_path / "part", size, hasher, ranges=Ranges(streams=3, size=128 << 10),
          on_prefix=lambda reach: offered.append((reach, hashers[-1].size)))
    reaches = [reach for reach, _ in offered]
    assert reaches == sorted(set(reaches)) and reaches[-1] == size
    assert all(hashed < reach for reach, hashed in offered)
    assert hashers[-1].size == size
