"""The S3 backend of :class:`~k3artifacts.stores.base.Store`: ``s3://bucket/prefix``.

Same key layout as the file store, under ``prefix``. What S3 gives us instead of rename:

* **Visibility**: a revision's objects are uploaded first and its ``.k3a/manifest.json`` last
  (conditional put: never overwritten); readers treat a revision without it as absent.
* **Integrity**: every object carries a CRC64NVME *full-object* checksum that we compute from
  the quarantine file in the same pass that re-checks its sha256 against the verified record,
  and hand to S3 with the upload. S3 verifies the bytes it received against it (a multipart
  upload with a full-object checksum is rejected with BadDigest if any byte differs), so the
  chain is: upstream sha256 == record == local bytes == CRC S3 checked. After the upload we read
  back what S3 stored (HEAD with ChecksumMode) and compare it with ours, because some S3
  implementations (moto among them) verify nothing. Why CRC64NVME and not SHA-256:
  docs/guides/s3-and-fsx.md, "Checksums". Our sha256 and xxh3-128
  ride along as object metadata (``x-amz-meta-k3a-sha256``, ``x-amz-meta-k3a-xxh3-128``).
* **Streaming**: a shard at or above the multipart threshold is sent by this package in parts
  (:class:`_PartUpload`) while it is still downloading into quarantine, each part one ``pread``
  of bytes still in the page cache; the upload is completed only after the shard is verified
  and only if the CRCs of the parts sent combine to the CRC of the verified bytes. Smaller
  files go in one PUT after verification (s3transfer).
* **Reuse**: a file staging planned to take from a published revision of the same repo
  (:meth:`S3RevisionWriter.reuse`) is not copied at all: the new revision's object records
  (``.k3a/s3-objects.json``) name the object and version the source's records name, after a
  HEAD holds it to the file's size, sha256 and the CRC64NVME S3 checked at its upload. Readers
  follow the records; :meth:`S3Store.materialize` copies the objects into the prefix (s3transfer
  ``copy``: UploadPartCopy parts in parallel, past 5 GiB too) where a server reads the prefix
  itself; :meth:`S3Store.delete_revision` keeps every object some revision's records name
  (docs/architecture.md, "A new commit costs what it changed").
* **Resume**: an object already at its key with the record's sha256 and size is kept, so a
  re-run after a crash uploads only what is missing.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import http.client
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlparse

import botocore.exceptions as bex
from awscrt import checksums as crt_checksums
from botocore.handlers import convert_body_to_file_like_object

from k3artifacts import faultpoints
from k3artifacts.canonical import canonical_json
from k3artifacts.errors import (
    AlreadyExists,
    ConfigError,
    Conflict,
    K3AError,
    NotFound,
    Unavailable,
    VerifyMismatch,
)
from k3artifacts.revisions.manifest import (
    FileRecord,
    ShardManifest,
    manifest_key,
    provenance_key,
    revision_prefix,
)
from k3artifacts.settings import load
from k3artifacts.stores import awsclients
from k3artifacts.stores.awsclients import aws_errors, error_code, http_status
from k3artifacts.stores.base import (
    OBJECT_RECORDS_REL,
    NotPublished,
    ObjectRecord,
    Placement,
    ProgressCallback,
    PutReceipt,
    RangeReader,
    ReuseFailed,
    RevisionWriter,
    ShortRead,
    Sink,
    Store,
    StreamedPut,
    Versioned,
)
from k3artifacts.stores.capabilities import ensure_conditional_writes

if TYPE_CHECKING:
    from s3transfer.manager import TransferConfig, TransferManager

log = logging.getLogger(__name__)

MiB = 1024 * 1024
GiB = 1024 * MiB
#: Bytes gathered before a transfer's progress is handed on (see _Progress).
PROGRESS_STEP = 8 * MiB
#: S3's limit on parts per multipart upload.
MAX_PARTS = 10_000
META_SHA256 = "k3a-sha256"
META_XXH3 = "k3a-xxh3-128"
CHECKSUM_ALGORITHM = "CRC64NVME"
READ_BLOCK = 8 * MiB

#: What S3 answers when a copy source (or the version pinned) does not exist.
_GONE = {"NoSuchKey", "NoSuchVersion", "404", "InvalidArgument"}
#: What S3 answers when the bytes it received do not match the checksum sent with them.
_DIGEST_ERRORS = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch"}

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class TransferTuning:
    """How s3transfer moves one file. Defaults suit multi-GB shards on a large instance.

    Memory stays bounded: parts are read from the file as they are sent (never buffered
    whole), and at most ``max_concurrency`` parts are in flight per file.
    """

    #: s3transfer's threshold: files it moves (in-bucket copies) at least this big go
    #: multipart (parallel parts, per-part retries). Our own uploads follow :meth:`in_parts`.
    multipart_threshold: int = 64 * MiB
    #: Smallest part; grown per file so that no file needs more than MAX_PARTS parts.
    min_part_size: int = 64 * MiB
    #: Parallel part uploads (or part copies) per file.
    max_concurrency: int = 8
    #: Bytes per second across one transfer, or None for no limit.
    max_bandwidth: int | None = None
    #: Part size of uploads this package sends itself (streamed while downloading, or from a
    #: verified file): each part in flight is one buffer, so memory is ``max_concurrency`` of
    #: these per file in flight, whatever the file size.
    stream_part_size: int = 16 * MiB

    @classmethod
    def from_env(cls) -> TransferTuning:
        """Defaults, overridden by ``K3A_S3_PART_SIZE`` (also the multipart threshold),
        ``K3A_S3_CONCURRENCY`` (parts in flight per file): what a staging worker reads, so
        every process of a run moves bytes the same way."""
        tuning = cls()
        settings = load()
        if settings.s3_part_size is not None:
            size = settings.s3_part_size
            tuning = dataclasses.replace(tuning, multipart_threshold=size, min_part_size=size,
                                         stream_part_size=size)
        if settings.s3_concurrency is not None:
            tuning = dataclasses.replace(tuning, max_concurrency=settings.s3_concurrency)
        return tuning

    def part_size(self, size: int) -> int:
        """Part size for a file of ``size`` bytes: ``min_part_size``, or the smallest whole MiB
        that keeps the upload within S3's 10,000 parts (64 MiB parts reach 625 GiB; a 1 TiB
        file gets 105 MiB parts)."""
        needed = math.ceil(size / MAX_PARTS)
        return max(self.min_part_size, math.ceil(needed / MiB) * MiB)

    def in_parts(self, size: int) -> bool:
        """A file of at least one stream part is sent as our own parts (streamed while it
        downloads, or from the verified file); only smaller ones go through s3transfer as one
        PUT, which over plain HTTP signs the payload: a second sha256 of the file, read by
        the signer under the GIL."""
        return size >= self.stream_part_size

    def upload_part_size(self, size: int) -> int:
        """Part size of a streamed upload of ``size`` bytes, grown like :meth:`part_size`."""
        needed = math.ceil(size / MAX_PARTS)
        return max(min(self.stream_part_size, self.min_part_size),
                   math.ceil(needed / MiB) * MiB)

    def config(self, size: int) -> TransferConfig:
        # s3transfer is imported only by what moves a file through it (a whole-file upload,
        # an in-bucket copy): a pull or a sign starts without it (issue 22).
        from s3transfer.manager import TransferConfig

        return TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=self.part_size(size),
            max_request_concurrency=self.max_concurrency,
            max_submission_concurrency=2,
            max_in_memory_upload_chunks=self.max_concurrency,
            max_bandwidth=self.max_bandwidth,
        )


@dataclass
class TransferCounters:
    """What went over the wire, for tests, benchmarks and the staging report. Thread-safe."""

    bytes_uploaded: int = 0
    bytes_copied: int = 0
    objects_uploaded: int = 0
    objects_copied: int = 0
    objects_skipped: int = 0
    #: Files a new revision reads where a published one keeps them: no byte moved.
    objects_referenced: int = 0
    bytes_referenced: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}


@dataclass(frozen=True)
class ObjectReceipt(PutReceipt):
    """What S3 reported for one object of a revision after it was put, copied or found."""

    key: str
    etag: str
    version_id: str | None
    checksum_crc64nvme: str | None
    checksum_type: str | None
    copied_from: str | None = None
    #: The published revision whose object this file reads by reference (``key`` is then
    #: outside this revision's prefix until :meth:`S3Store.materialize` copies it in).
    referenced_from: str | None = None


def crc64nvme_and_sha256(path: Path) -> tuple[str, str, int]:
    """One pass over ``path``: (base64 CRC64NVME as S3 writes it, sha256 hex, size)."""
    crc = 0
    sha = hashlib.sha256()
    size = 0
    buf = bytearray(READ_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            chunk = view[:n]
            crc = crt_checksums.crc64nvme(chunk, crc)
            sha.update(chunk)
            size += n
    return base64.b64encode(crc.to_bytes(8, "big")).decode("ascii"), sha.hexdigest(), size


class _Progress:
    """Counts one transfer's bytes for the counters and the progress callback (an s3transfer
    subscriber: s3transfer calls the ``on_*`` methods a subscriber has).

    s3transfer reports every block http.client sends (8-16 KiB), hundreds of thousands of
    calls per GiB from its worker threads; a profile of a 4 GiB staging found 7% of it in the
    callback. Bytes are therefore gathered here and handed on once per PROGRESS_STEP and when
    the transfer ends, so counters and the display stay exact at the end and cost nothing
    in between."""

    def __init__(self, path: str, counters: list[TransferCounters], field_name: str,
                 callback: ProgressCallback | None):
        self.path = path
        self.counters = counters
        self.field_name = field_name
        self.callback = callback
        self._pending = 0
        self._lock = threading.Lock()

    def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
        with self._lock:
            self._pending += bytes_transferred
            if -PROGRESS_STEP < self._pending < PROGRESS_STEP:
                return
            amount, self._pending = self._pending, 0
        self._hand_on(amount)

    def on_done(self, future: Any, **kwargs: Any) -> None:
        with self._lock:
            amount, self._pending = self._pending, 0
        if amount:
            self._hand_on(amount)

    def _hand_on(self, amount: int) -> None:
        for counters in self.counters:
            counters.add(**{self.field_name: amount})
        if self.callback is not None:
            self.callback(self.path, amount)


def _etag(resp: dict[str, Any]) -> str:
    return str(resp["ETag"])


class S3Store(Store):
    """``s3://bucket/prefix`` through botocore + s3transfer.

    ``counters`` sum every writer's transfers; ``progress`` is handed to each new writer.
    """

    #: Keys per ListObjectsV2 page (S3 returns at most 1000).
    list_page_size = 1000
    wanted_checksums = frozenset({"crc64nvme"})
    identity_source = "sts"
    regional = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        region: str | None = None,
        tuning: TransferTuning | None = None,
        progress: ProgressCallback | None = None,
    ):
        if not _BUCKET_RE.match(bucket):
            raise ConfigError(
                f"{bucket!r} is not a valid S3 bucket name",
                hint="bucket names are 3-63 characters of a-z, 0-9, '.' and '-'; "
                "write the store as s3://bucket/prefix",
            )
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = client or awsclients.s3_client(endpoint_url, profile, region)
        awsclients.fail_fast_until_connected(self.client)
        self.tuning = tuning or TransferTuning.from_env()
        self.progress = progress
        self.counters = TransferCounters()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> S3Store:
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ConfigError(
                f"{url!r} is not an s3://bucket[/prefix] URL",
                hint="write the store as s3://bucket/prefix, e.g. s3://my-models/k3a",
            )
        if parsed.query or parsed.fragment:
            raise ConfigError(
                f"store URL {url!r} has a query or fragment",
                hint="write the store as s3://bucket/prefix; set the endpoint with "
                "K3A_S3_ENDPOINT_URL and the region with AWS_REGION",
            )
        return cls(parsed.netloc, parsed.path, **kwargs)

    @classmethod
    def placement_at(cls, store_url: str, revision_path: str) -> Placement:
        parsed = urlparse(store_url)
        return Placement(store_url=store_url, revision_path=revision_path,
                         bucket=parsed.netloc, s3_prefix=parsed.path.strip("/"))

    def region(self) -> str | None:
        # The client's region already follows AWS_REGION / AWS_DEFAULT_REGION and the profile.
        settings = load()
        return (self.client.meta.region_name or settings.aws_region
                or settings.aws_default_region)

    def watch_transfers(self, progress: ProgressCallback | None) -> None:
        self.progress = progress

    def exists(self) -> bool:
        """The bucket exists and holds something under ``models/`` or ``releases/``.

        Those two listings, not HeadBucket or a listing of the whole prefix, because they are
        what every k3a role may list (policies/iam/*.json scope ListBucket by prefix); a
        listing that is denied says nothing, and the store is then taken to be there."""
        denied = False
        for sub in ("models/", "releases/"):
            s3_prefix = f"{self.prefix}/{sub}" if self.prefix else sub
            with aws_errors(f"looking for the store {self.url}"):
                try:
                    resp = self.client.list_objects_v2(
                        Bucket=self.bucket, Prefix=s3_prefix, MaxKeys=1
                    )
                except bex.ClientError as exc:
                    if error_code(exc) == "NoSuchBucket":
                        return False
                    if http_status(exc) == 403:
                        denied = True
                        continue
                    raise
            if resp.get("KeyCount", len(resp.get("Contents", []))):
                return True
        return denied

    # ---- keys ----------------------------------------------------------------------------
    def key(self, key: str) -> str:
        """The S3 object key of store key ``key``."""
        parts = key.split("/")
        if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ConfigError(f"invalid store key {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _unkey(self, s3_key: str) -> str:
        return s3_key[len(self.prefix) + 1 :] if self.prefix else s3_key

    def s3_url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.key(key)}"

    # ---- small records -------------------------------------------------------------------
    def read(self, key: str) -> Versioned | None:
        with aws_errors(f"reading {self.s3_url(key)}"):
            try:
                resp = self.client.get_object(Bucket=self.bucket, Key=self.key(key))
            except bex.ClientError as exc:
                if error_code(exc) == "NoSuchKey":
                    return None
                raise
            with resp["Body"] as body:
                return Versioned(body.read(), _etag(resp))

    def _put_small(self, key: str, data: bytes, **conditions: str) -> dict[str, Any]:
        if key.startswith("releases/"):
            # Release records (tuples, reviews, history, pointers) are conditional writes:
            # refuse a server that would ignore the condition, before the first one. (Staging's
            # manifests are too, but its role may not write where the probe does.)
            ensure_conditional_writes(self.client, self.client.meta.endpoint_url, self.bucket,
                                      self.prefix)
        return self.client.put_object(
            Bucket=self.bucket,
            Key=self.key(key),
            Body=data,
            ContentType="application/json",
            ChecksumAlgorithm=CHECKSUM_ALGORITHM,
            **conditions,
        )

    def create(self, key: str, data: bytes) -> None:
        with aws_errors(f"creating {self.s3_url(key)}"):
            try:
                self._put_small(key, data, IfNoneMatch="*")
            except bex.ClientError as exc:
                if http_status(exc) == 412:
                    raise AlreadyExists(key) from None
                if http_status(exc) == 409:  # another conditional write to this key in flight
                    raise Conflict(
                        f"{key}: a concurrent write to the same key is in progress",
                        hint="re-read and retry",
                    ) from None
                raise

    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        with aws_errors(f"replacing {self.s3_url(key)}"):
            try:
                return _etag(self._put_small(key, data, **condition))
            except bex.ClientError as exc:
                # 412: the ETag moved (or the key appeared); 409: a racing conditional write;
                # 404 on If-Match: the key we expected is gone.
                if http_status(exc) in (409, 412) or (
                    expected is not None and error_code(exc) == "NoSuchKey"
                ):
                    raise Conflict(
                        f"{key} changed under us (expected version {expected})",
                        hint="re-read the current value and decide again",
                    ) from None
                raise

    def object_sizes(self, prefix: str) -> dict[str, int]:
        s3_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        sizes: dict[str, int] = {}
        with aws_errors(f"listing s3://{self.bucket}/{s3_prefix}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=s3_prefix,
                PaginationConfig={"PageSize": self.list_page_size},
            )
            for page in pages:
                sizes.update((self._unkey(o["Key"]), o["Size"]) for o in page.get("Contents", []))
        return sizes

    def list_keys(self, prefix: str) -> list[str]:
        return sorted(self.object_sizes(prefix))

    def delete(self, key: str) -> None:
        with aws_errors(f"deleting {self.s3_url(key)}"):
            self.client.delete_object(Bucket=self.bucket, Key=self.key(key))

    def modified_at(self, key: str) -> datetime | None:
        found = self.head(key)
        return None if found is None else found["LastModified"]

    # ---- objects -------------------------------------------------------------------------
    def head(self, key: str, version_id: str | None = None) -> dict[str, Any] | None:
        """HEAD of store key ``key`` (at ``version_id``) with its checksum, or None when
        absent."""
        version = {"VersionId": version_id} if version_id and version_id != "null" else {}
        with aws_errors(f"inspecting {self.s3_url(key)}"):
            try:
                return self.client.head_object(
                    Bucket=self.bucket, Key=self.key(key), ChecksumMode="ENABLED", **version
                )
            except bex.ClientError as exc:
                # 400: a version id this bucket never issued (S3 answers so for a malformed
                # one); 404/405: absent, or a delete marker.
                if http_status(exc) in (404, 405) or (version and http_status(exc) == 400):
                    return None
                raise

    def open_object(self, record: ObjectRecord) -> BinaryIO:
        """A streaming reader of the object ``record`` names, at its recorded version."""
        version = {"VersionId": record.version_id} if record.version_id else {}
        with aws_errors(f"reading {self.s3_url(record.key)}"):
            try:
                resp = self.client.get_object(Bucket=self.bucket, Key=self.key(record.key),
                                              **version)
            except bex.ClientError as exc:
                if error_code(exc) in ("NoSuchKey", "NoSuchVersion") or http_status(exc) == 404:
                    raise NotFound(f"{record.key} is not in {self.url}") from None
                raise
        body: BinaryIO = resp["Body"]
        return body

    def open_read(self, key: str) -> BinaryIO:
        with aws_errors(f"reading {self.s3_url(key)}"):
            try:
                resp = self.client.get_object(Bucket=self.bucket, Key=self.key(key))
            except bex.ClientError as exc:
                if error_code(exc) == "NoSuchKey":
                    raise NotFound(f"{key} is not in {self.url}") from None
                raise
        body: BinaryIO = resp["Body"]
        return body

    # ---- revisions -----------------------------------------------------------------------
    def begin_revision(self, repo_id: str, commit: str) -> S3RevisionWriter:
        return S3RevisionWriter(self, repo_id, commit)

    def clean_incomplete(self, repo_id: str, commit: str) -> int:
        stale = self.abort_multipart_uploads(revision_prefix(repo_id, commit))
        if stale:
            log.info("aborted %d multipart upload(s) left under %s", stale,
                     revision_prefix(repo_id, commit))
        return stale

    def object_records(self, repo_id: str, commit: str) -> dict[str, ObjectRecord]:
        found = self.read(f"{revision_prefix(repo_id, commit)}/{OBJECT_RECORDS_REL}")
        if found is None:
            return {}
        records = {}
        for obj in json.loads(found.data).get("objects", []):
            version = obj.get("version_id")
            crc = obj.get("checksum_crc64nvme")
            full = obj.get("checksum_type") in (None, "FULL_OBJECT")
            records[obj["path"]] = ObjectRecord(
                path=obj["path"],
                key=self._unkey(obj["key"]),
                size=int(obj["size"]),
                version_id=version if version and version != "null" else None,
                crc64nvme=crc if crc and full else None,
            )
        return records

    def read_sizes(self, repo_id: str, commit: str) -> dict[str, int]:
        sizes = super().read_sizes(repo_id, commit)
        prefix = revision_prefix(repo_id, commit)
        for record in self.object_records(repo_id, commit).values():
            if record.key != f"{prefix}/{record.path}":
                head = self.head(record.key, record.version_id)
                if head is not None:
                    sizes[record.path] = int(head["ContentLength"])
        return sizes

    def companion_client(self, connections: int, *, sign_payload: bool | None = None) -> Any:
        """A client on the store's endpoint and region with ``connections`` in its pool, for
        a transfer that runs that many requests at once."""
        endpoint = self.client.meta.endpoint_url
        if "amazonaws.com" in (endpoint or ""):
            endpoint = None
        return awsclients.client("s3", endpoint_url=endpoint,
                                 region=self.client.meta.region_name,
                                 max_pool_connections=connections, sign_payload=sign_payload)

    def open_ranges(self, repo_id: str, commit: str, connections: int) -> RangeReader:
        return _S3Ranges(self, revision_prefix(repo_id, commit),
                         self.object_records(repo_id, commit), connections)

    def delete_revision(self, repo_id: str, commit: str) -> int:
        if self.read_manifest(repo_id, commit) is None:
            raise NotPublished(repo_id, commit, self.url)
        # Manifest first: from that instant readers see no revision, never half of one, and
        # a writer that references this revision's objects finds it gone before it publishes
        # (S3RevisionWriter.commit), so the scan below sees every reference that can still
        # be published.
        mkey = manifest_key(repo_id, commit)
        with aws_errors(f"deleting {self.s3_url(mkey)}"):
            self.client.delete_object(Bucket=self.bucket, Key=self.key(mkey))
        doomed = self._unreferenced(repo_id, commit)
        refused = set(self._delete_keys(sorted(doomed)))
        return sum(size for key, size in doomed.items() if key not in refused)

    def repair_file(self, repo_id: str, commit: str, record: FileRecord,
                    local_path: Path) -> None:
        """Upload the file under the revision's own prefix (a new version) and record that
        version as the object it reads, where its record named a damaged object (its own, or
        another revision's by reference)."""
        self.published_manifest(repo_id, commit)
        prefix = revision_prefix(repo_id, commit)
        writer = S3RevisionWriter(self, repo_id, commit)
        receipt = writer._upload(record, f"{prefix}/{record.path}", local_path, None)
        records_key = f"{prefix}/{OBJECT_RECORDS_REL}"
        found = self.read(records_key)
        if found is None:
            return  # a revision without records reads its prefix, which now holds the file
        body = json.loads(found.data)
        for obj in body["objects"]:
            if obj["path"] == record.path:
                obj.clear()
                obj.update(dataclasses.asdict(receipt))
        self.replace(records_key, canonical_json(body), found.token)

    def reclaimable_bytes(self, repo_id: str, commit: str) -> int:
        return sum(self._unreferenced(repo_id, commit).values())

    def _unreferenced(self, repo_id: str, commit: str) -> dict[str, int]:
        """Key -> size of the revision's objects no other revision reads (the current
        versions; noncurrent ones expire by the bucket's lifecycle rule)."""
        needed = self.referenced_keys(repo_id, but=commit)
        return {k: size for k, size in self.object_sizes(f"{revision_prefix(repo_id, commit)}/")
                .items() if k not in needed}

    def referenced_keys(self, repo_id: str, *, but: str | None = None) -> set[str]:
        """Every object key the revisions of ``repo_id`` (other than ``but``) read: from
        their object records, published or being published (records come before the
        manifest), which is what may never be deleted."""
        suffix = f"/{OBJECT_RECORDS_REL}"
        base = f"models/{repo_id}/"
        needed: set[str] = set()
        for key in self.list_keys(base):
            commit = key[len(base):-len(suffix)]
            if not key.endswith(suffix) or commit == but or "/" in commit:
                continue
            needed.update(r.key for r in self.object_records(repo_id, commit).values())
        return needed

    def materialize(self, repo_id: str, commit: str, *, workers: int = 16) -> int:
        """Copy, inside S3, every object a published revision reads by reference into its
        own prefix, many at once (each a parallel UploadPartCopy), then record the copies as
        the objects it reads. Returns the bytes copied (0 when the prefix is complete)."""
        records = self.object_records(repo_id, commit)
        prefix = revision_prefix(repo_id, commit)
        outside = [r for r in records.values() if r.key != f"{prefix}/{r.path}"]
        if not outside:
            return 0
        manifest = self.published_manifest(repo_id, commit)
        writer = S3RevisionWriter(self, repo_id, commit)
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="k3a-materialize") as pool:
            list(pool.map(lambda r: writer.copy_in(manifest.file(r.path), r), outside))
        records_key = f"{prefix}/{OBJECT_RECORDS_REL}"
        found = self.read(records_key)
        assert found is not None  # object_records found it above
        body = json.loads(found.data)
        for obj in body["objects"]:
            if obj["path"] in writer.receipts:
                obj.update(dataclasses.asdict(writer.receipts[obj["path"]]))
        try:
            self.replace(records_key, canonical_json(body), found.token)
        except Conflict:
            pass  # another materialize recorded its copies first: the same objects
        return sum(r.size for r in outside)

    def _delete_keys(self, keys: list[str]) -> list[str]:
        """Delete store keys in batches; returns those S3 refused (e.g. by bucket policy)."""
        refused: list[str] = []
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            with aws_errors(f"deleting {len(batch)} objects under {self.url}"):
                resp = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self.key(k)} for k in batch], "Quiet": True},
                )
            refused.extend(self._unkey(err["Key"]) for err in resp.get("Errors", []))
        return refused

    def abort_multipart_uploads(self, prefix: str) -> int:
        """Abort every in-progress multipart upload under store prefix ``prefix``."""
        s3_prefix = self.key(prefix.rstrip("/")) + "/"
        aborted = 0
        with aws_errors(f"cleaning multipart uploads under s3://{self.bucket}/{s3_prefix}"):
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=s3_prefix
            )
            for page in pages:
                for upload in page.get("Uploads", []):
                    try:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                    except bex.ClientError as exc:
                        if error_code(exc) != "NoSuchUpload":  # finished or aborted meanwhile
                            raise
                    aborted += 1
        return aborted


class _S3Ranges(RangeReader):
    """Ranged ``GetObject`` on a client whose pool has a connection per worker, each response
    read straight into the caller's buffer. Each object is read at the version its revision
    recorded, so an overwrite in the middle of a pull cannot mix two objects' bytes; the
    CRC64NVME recorded there is offered for checking too."""

    def __init__(self, store: S3Store, prefix: str, records: dict[str, ObjectRecord],
                 connections: int):
        self.store = store
        self.prefix = prefix
        self.records = records
        self.client = store.companion_client(connections)
        self.checksums = {p: {"crc64nvme": r.crc64nvme} for p, r in records.items()
                          if r.crc64nvme}

    def read_range(self, path: str, offset: int, length: int, buf: memoryview,
                   sink: Sink) -> None:
        record = self.records.get(path)
        key = record.key if record is not None else f"{self.prefix}/{path}"
        args = {"Bucket": self.store.bucket, "Key": self.store.key(key),
                "Range": f"bytes={offset}-{offset + length - 1}"}
        if record is not None and record.version_id:
            args["VersionId"] = record.version_id
        try:
            resp = self.client.get_object(**args)
            body = resp["Body"]
            raw = getattr(body, "_raw_stream", None)
            read_into = _socket_reader(raw)
            done = 0
            with body:
                while done < length:
                    want = buf[: min(len(buf), length - done)]
                    if read_into is not None:
                        n = read_into(want)
                    else:
                        chunk = body.read(len(want))
                        n = len(chunk)
                        want[:n] = chunk
                    if not n:
                        raise ShortRead(f"{path}: response ended at {offset + done}")
                    sink(buf[:n])
                    done += n
                if read_into is not None and raw._fp.isclosed():
                    # Read to its end behind urllib3's back: hand the connection back to the
                    # pool ourselves, or closing the body would close it.
                    raw.release_conn()
        except (bex.BotoCoreError, bex.ClientError) as exc:
            raise awsclients.translate(exc, f"reading {self.store.s3_url(key)}") from exc
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # urllib3 protocol errors surface as OSError/ValueError; a connection cut while
            # reading through http.client as IncompleteRead.
            raise Unavailable(f"reading {path}: {exc}") from exc


def _socket_reader(raw: Any) -> Callable[[memoryview], int] | None:
    """``readinto`` of the http.client response under urllib3's, where the body is sent as is.

    urllib3's own ``readinto`` reads into a new bytes object and copies it into the buffer: per
    MiB a fresh allocation (an mmap, 256 page faults, an munmap) and a copy. http.client's
    reads from the socket straight into our buffer and stops at Content-Length. Where the
    body is content-encoded (urllib3 would decode it) or the private attribute is gone, None:
    the caller reads through botocore."""
    fp = getattr(raw, "_fp", None)
    headers = getattr(raw, "headers", None)
    if not isinstance(fp, http.client.HTTPResponse) or headers is None:
        return None
    if headers.get("Content-Encoding", "identity").lower() != "identity":
        return None
    return fp.readinto


#: How far behind the downloaded offset a streamed part must end. The downloader writes through
#: a buffered file object that holds at most its buffer (st_blksize, a few KiB) back from the
#: OS; a part ending a MiB behind is in the page cache, where our own pread sees it.
STREAM_LAG = 1 * MiB


def _b64_crc(crc: int) -> str:
    return base64.b64encode(crc.to_bytes(8, "big")).decode("ascii")


class _PartUpload(StreamedPut):
    """One file's multipart upload, sent by this package part by part.

    Each part is read with one ``pread`` (the GIL is released for the whole read, where
    s3transfer's file upload hands http.client a file it reads 8-16 KiB at a time under the
    lock) and sent as one buffer with its CRC64NVME, computed here. The CRCs of the parts, in
    order, combine into the CRC64NVME of what was sent; :meth:`finish` completes the upload only
    if that equals the CRC computed from the bytes as they were downloaded and verified, and
    hands the same value to S3 as the full-object checksum. A part read too early, a download
    that restarted from zero, a file changed under us: each is caught there, by construction,
    whatever the server checks.

    Crash safety is S3's: until CompleteMultipartUpload nothing is an object, and a crashed
    run's uploads are aborted by :meth:`S3Store.clean_incomplete`.
    """

    def __init__(self, writer: S3RevisionWriter, path: str, size: int, local_path: Path,
                 metadata: dict[str, str]):
        self.writer = writer
        self.metadata = metadata
        self.store = writer.store
        self.path = path
        self.size = size
        self.local_path = local_path
        self.key = f"{writer.prefix}/{path}"
        self.s3_key = self.store.key(self.key)
        self._part_size = self.store.tuning.upload_part_size(size)
        self._fd: int | None = None
        self._upload_id: str | None = None
        self._next = 0  # offset of the first part not yet submitted
        self._futures: list[Any] = []
        self._parts: dict[int, tuple[dict[str, Any], int, int]] = {}  # n -> (part, crc, len)
        self._lock = threading.Lock()
        self._failed: BaseException | None = None
        #: TransferTuning.max_bandwidth: parts start no faster than it allows.
        self._bandwidth = self.store.tuning.max_bandwidth
        self._paced_from: float | None = None
        self._paced_bytes = 0

    # ----- called by the downloading thread -------------------------------------------------------

    def written(self, upto: int) -> None:
        if self._failed is not None:
            return  # finish() reports it; the download goes on
        while self._next + self._part_size <= min(upto - STREAM_LAG, self.size):
            self._open(self.local_path)
            self._submit(self._next, self._part_size)

    def _open(self, path: Path) -> None:
        """Open the file on the caller's thread, while ``path`` names it: the downloader moves
        a verified file out of its partial name, possibly before a queued part is read."""
        with self._lock:
            if self._fd is None:
                self._fd = os.open(path, os.O_RDONLY)

    def _submit(self, offset: int, length: int) -> None:
        number = offset // self._part_size + 1
        self._next = offset + length
        self._futures.append(self.writer.pool().submit(self._send, number, offset, length))

    # ----- on the writer's pool -------------------------------------------------------------------

    def _upload(self) -> str:
        with self._lock:
            if self._upload_id is None:
                self.writer.note_written(self.key)
                resp = self.store.client.create_multipart_upload(
                    Bucket=self.store.bucket, Key=self.s3_key,
                    ChecksumAlgorithm=CHECKSUM_ALGORITHM, ChecksumType="FULL_OBJECT",
                    Metadata=self.metadata,
                )
                self._upload_id = resp["UploadId"]
            return self._upload_id

    def _send(self, number: int, offset: int, length: int) -> None:
        try:
            upload_id = self._upload()
            self._pace(length)
            assert self._fd is not None
            data = os.pread(self._fd, length, offset)
            while len(data) < length:  # short reads happen on some filesystems
                more = os.pread(self._fd, length - len(data), offset + len(data))
                if not more:
                    raise ShortRead(f"{self.local_path}: ended at {offset + len(data)}")
                data += more
            crc = crt_checksums.crc64nvme(data)
            resp = self.writer.part_client().upload_part(
                Bucket=self.store.bucket, Key=self.s3_key, UploadId=upload_id,
                PartNumber=number, Body=data, ChecksumCRC64NVME=_b64_crc(crc),
            )
            part = {"PartNumber": number, "ETag": resp["ETag"],
                    "ChecksumCRC64NVME": resp.get("ChecksumCRC64NVME") or _b64_crc(crc)}
            with self._lock:
                self._parts[number] = (part, crc, length)
            self.writer.sent(self.path, length)
        except BaseException as exc:
            self._failed = exc
            raise

    # ----- the end --------------------------------------------------------------------------------

    def _pace(self, length: int) -> None:
        """Hold a part until the bytes sent before it fit ``max_bandwidth`` (no limit: go)."""
        if not self._bandwidth:
            return
        with self._lock:
            now = time.monotonic()
            if self._paced_from is None:
                self._paced_from = now
            due = self._paced_from + self._paced_bytes / self._bandwidth
            self._paced_bytes += length
        if due > now:
            time.sleep(due - now)

    def _drain(self) -> None:
        for future in self._futures:
            future.exception()  # wait for all of them before reporting the first failure
        self._futures.clear()
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed

    def finish(self, record: FileRecord, checksums: Mapping[str, str],
               local_path: Path) -> ObjectReceipt | None:
        crc = checksums.get("crc64nvme")
        if crc is None or record.size != self.size or (
                self.metadata.get(META_SHA256) != record.sha256):
            self.cancel()
            return None
        what = f"uploading {self.local_path} to s3://{self.store.bucket}/{self.s3_key}"
        try:
            with aws_errors(what):
                if self._next < self.size:
                    self._open(local_path)  # where nothing was sent yet, the file is there now
                while self._next < self.size:
                    self._submit(self._next, min(self._part_size, self.size - self._next))
                self._drain()
                sent = 0
                for number in sorted(self._parts):
                    _, part_crc, length = self._parts[number]
                    sent = crt_checksums.combine_crc64nvme(sent, part_crc, length)
                if _b64_crc(sent) != crc:
                    log.warning("%s: the parts sent while it downloaded are not the verified "
                                "bytes (download restarted?); uploading it again whole",
                                self.path)
                    self.cancel()
                    return None
                try:
                    self.store.client.complete_multipart_upload(
                        Bucket=self.store.bucket, Key=self.s3_key, UploadId=self._upload(),
                        ChecksumCRC64NVME=crc, ChecksumType="FULL_OBJECT",
                        MultipartUpload={"Parts": [self._parts[n][0]
                                                   for n in sorted(self._parts)]},
                    )
                except bex.ClientError as exc:
                    if error_code(exc) not in _DIGEST_ERRORS:
                        raise
                    raise VerifyMismatch(
                        f"s3://{self.store.bucket}/{self.s3_key}: S3 refused the upload: the "
                        f"bytes it received do not match CRC64NVME {crc} ({error_code(exc)})",
                        hint="corrupted in transit; nothing was published, re-run",
                    ) from None
        except BaseException:
            self.cancel()
            raise
        self._close()
        return self.writer.finish_upload(record, self.key, crc)

    def cancel(self) -> None:
        for future in self._futures:
            future.cancel()
        for future in self._futures:
            if not future.cancelled():
                future.exception()
        self._futures.clear()
        self._failed = None
        if self._upload_id is not None:
            with contextlib.suppress(bex.BotoCoreError, bex.ClientError):
                self.store.client.abort_multipart_upload(
                    Bucket=self.store.bucket, Key=self.s3_key, UploadId=self._upload_id)
            self._upload_id = None
        self._parts.clear()
        self._next = 0
        self._close()

    def _close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class S3RevisionWriter(RevisionWriter):
    """Puts one revision's objects; :meth:`commit` writes the manifest last.

    Several writers of one revision may put files at once (staging workers in other processes
    each open their own); opening one touches nothing in S3. Multipart uploads a crashed run
    left behind are cleaned by :meth:`S3Store.clean_incomplete`, an explicit step of a run.
    ``receipts`` holds what S3 reported per file, ``counters`` this writer's transfers, and
    ``abort_leftovers`` the keys :meth:`abort` was not allowed to delete.
    """

    def __init__(self, store: S3Store, repo_id: str, commit: str):
        self.store = store
        self.repo_id = repo_id
        self.commit_sha = commit
        self.prefix = revision_prefix(repo_id, commit)
        self.progress: ProgressCallback | None = store.progress
        self.counters = TransferCounters()
        self.receipts: dict[str, ObjectReceipt] = {}
        self.abort_leftovers: list[str] = []
        self._written: set[str] = set()
        self._lock = threading.Lock()
        #: Per source commit: its s3-objects.json receipts by path (None: it has none).
        self._sources: dict[str, dict[str, dict[str, Any]] | None] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._part_client: Any = None
        self._files_at_once = 1

    def _source_receipt(self, commit: str, path: str) -> dict[str, Any] | None:
        """What S3 stored for ``path`` when revision ``commit`` was published."""
        with self._lock:
            if commit not in self._sources:
                found = self.store.read(
                    f"{revision_prefix(self.repo_id, commit)}/{OBJECT_RECORDS_REL}"
                )
                self._sources[commit] = None if found is None else {
                    o["path"]: o for o in json.loads(found.data)["objects"]
                }
            receipts = self._sources[commit]
        return None if receipts is None else receipts.get(path)

    def _matches(self, head: dict[str, Any] | None, record: FileRecord) -> bool:
        return (
            head is not None
            and head.get("Metadata", {}).get(META_SHA256) == record.sha256
            and int(head["ContentLength"]) == record.size
        )

    def _receipt(self, record: FileRecord, action: str, head: dict[str, Any],
                 copied_from: str | None = None) -> ObjectReceipt:
        receipt = ObjectReceipt(
            path=record.path,
            key=self.store.key(f"{self.prefix}/{record.path}"),
            size=int(head["ContentLength"]),
            action=action,
            etag=_etag(head),
            version_id=head.get("VersionId"),
            checksum_crc64nvme=head.get("ChecksumCRC64NVME"),
            checksum_type=head.get("ChecksumType"),
            copied_from=copied_from,
        )
        with self._lock:
            self.receipts[record.path] = receipt
        return receipt

    def _manager(self, size: int) -> TransferManager:
        from s3transfer.manager import TransferManager

        return TransferManager(self.store.client, self.store.tuning.config(size))

    def adopt(self, record: FileRecord) -> ObjectReceipt | None:
        key = f"{self.prefix}/{record.path}"
        existing = self.store.head(key)
        if not self._matches(existing, record):
            return None
        assert existing is not None
        self._count(objects_skipped=1)
        return self._receipt(record, "kept", existing)

    def stats(self) -> dict[str, int]:
        return self.counters.as_dict()

    def open_staged(self, path: str) -> BinaryIO:
        with self._lock:
            receipt = self.receipts.get(path)
        if receipt is not None and receipt.referenced_from:
            version = receipt.version_id if receipt.version_id != "null" else None
            return self.store.open_object(ObjectRecord(
                path, self.store._unkey(receipt.key), receipt.size, version))
        return self.store.open_read(f"{self.prefix}/{path}")

    def put_file(
        self, record: FileRecord, local_path: Path, *, checksums: Mapping[str, str] | None = None
    ) -> ObjectReceipt:
        """Put one verified file: keep it if already there, else upload it. Returns what S3
        stored. (Files a published revision holds are not downloaded at all: staging plans
        them as :meth:`reuse`.)"""
        key = f"{self.prefix}/{record.path}"
        existing = self.store.head(key)
        if self._matches(existing, record):
            assert existing is not None
            self._count(objects_skipped=1)
            return self._receipt(record, "kept", existing)
        return self._upload(record, key, local_path, (checksums or {}).get("crc64nvme"))

    def _count(self, **amounts: int) -> None:
        self.counters.add(**amounts)
        self.store.counters.add(**amounts)

    def _subscriber(self, record: FileRecord, field_name: str) -> _Progress:
        return _Progress(record.path, [self.counters, self.store.counters], field_name,
                         self.progress)

    def _upload(
        self, record: FileRecord, key: str, local_path: Path, crc: str | None
    ) -> ObjectReceipt:
        size = record.size
        if crc is None:
            # No CRC from the download: compute it, and re-check the sha256 on the same pass.
            crc, sha256, size = crc64nvme_and_sha256(local_path)
        else:
            # Computed as the bytes arrived; S3 checks the upload against it and the read-back
            # below holds S3 to it, so the file is not read an extra time here.
            sha256 = record.sha256
        if sha256 != record.sha256 or size != record.size:
            raise VerifyMismatch(
                f"{local_path}: changed since it was verified as {record.path} "
                f"(sha256 {sha256}, size {size}; the record says {record.sha256}, {record.size})",
                hint="nothing was uploaded for this file; re-download it into quarantine",
            )
        metadata = {META_SHA256: record.sha256, META_XXH3: record.xxh3_128}
        if self.store.tuning.in_parts(size):
            # Our own parts (one pread and one buffer each), whose CRCs must combine to ``crc``.
            upload = _PartUpload(self, record.path, size, local_path, metadata)
            receipt = upload.finish(record, {"crc64nvme": crc}, local_path)
            if receipt is None:
                raise VerifyMismatch(
                    f"{local_path}: changed while it was uploaded as {record.path} (its parts "
                    f"do not combine to CRC64NVME {crc})",
                    hint="nothing was published; re-run: the file is downloaded again",
                )
            return receipt
        extra = {
            "ChecksumAlgorithm": CHECKSUM_ALGORITHM,
            "ChecksumCRC64NVME": crc,
            "Metadata": metadata,
        }
        self.note_written(key)
        s3_key = self.store.key(key)
        with aws_errors(f"uploading {local_path} to s3://{self.store.bucket}/{s3_key}"):
            try:
                with self._manager(size) as manager:
                    manager.upload(
                        str(local_path), self.store.bucket, s3_key, extra_args=extra,
                        subscribers=[self._subscriber(record, "bytes_uploaded")],
                    ).result()
            except bex.ClientError as exc:
                if error_code(exc) not in _DIGEST_ERRORS:
                    raise
                raise VerifyMismatch(
                    f"s3://{self.store.bucket}/{s3_key}: S3 refused the upload of {local_path}:"
                    f" the bytes it received do not match CRC64NVME {crc} ({error_code(exc)})",
                    hint="the file changed during the upload or was corrupted in transit; "
                    "nothing was published, re-run",
                ) from None
        return self.finish_upload(record, key, crc)

    # ----- what _PartUpload asks of its writer ----------------------------------------------------

    def begin_put(
        self, path: str, size: int, sha256: str, local_path: Path
    ) -> _PartUpload | None:
        if not self.store.tuning.in_parts(size):
            return None  # one PUT after verification costs less than a multipart upload
        return _PartUpload(self, path, size, local_path, {META_SHA256: sha256})

    def expect_files(self, files: int) -> None:
        with self._lock:
            self._files_at_once = max(1, files)

    def pool(self) -> ThreadPoolExecutor:
        """Threads sending parts, shared by every file of this writer: ``max_concurrency``
        per file put at once. Their number bounds the part buffers in memory whatever the
        file sizes. One pool of 8 for 8 files in flight kept every download waiting on its
        last parts (16 cores, SeaweedFS: the upload threads were the run's limit), as a
        single S3 connection moves far less than a file's download does."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.store.tuning.max_concurrency * self._files_at_once,
                    thread_name_prefix="k3a-s3-part")
            return self._pool

    def part_client(self) -> Any:
        """The client the streamed parts go through: a connection per part thread, and
        bodies sent as ``UNSIGNED-PAYLOAD`` whatever the scheme. Each part carries its
        CRC64NVME in a signed header, which S3 checks, and the parts' CRCs must combine to the
        CRC of the bytes verified against upstream's sha256 before the upload is completed:
        a payload SHA256 would prove nothing more. Over HTTPS botocore already leaves such a
        body unsigned; over plain HTTP (an in-cluster store) it hashed every part inside the
        CRT signer while holding the interpreter lock: 55% of the lock's time in a 16-core
        profile of staging to SeaweedFS, the run's serial section.

        A part's bytes stay ``bytes`` down to the socket: botocore's stock handler wraps an
        UploadPart body in a BytesIO, which urllib3 then sends 16 KiB per Python iteration
        under the lock; a bytes body goes out in one ``sendall``, the lock released, and
        botocore resends it whole on a retry all the same. (A bytearray would pass too, but
        the CRT signer copies any body without ``seek`` into a BytesIO: 16 MiB per part
        under the lock, measured worse.)"""
        with self._lock:
            if self._part_client is None:
                client = self.store.companion_client(
                    self.store.tuning.max_concurrency * self._files_at_once, sign_payload=False)
                client.meta.events.unregister("before-parameter-build.s3.UploadPart",
                                              convert_body_to_file_like_object)
                self._part_client = client
            return self._part_client

    def note_written(self, key: str) -> None:
        with self._lock:
            self._written.add(key)

    def sent(self, path: str, nbytes: int) -> None:
        self._count(bytes_uploaded=nbytes)
        if self.progress is not None:
            self.progress(path, nbytes)

    def finish_upload(self, record: FileRecord, key: str, crc: str) -> ObjectReceipt:
        head = self._checked_head(key, record, crc)
        self._count(objects_uploaded=1)
        return self._receipt(record, "uploaded", head)

    def _close_pool(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def reuse(
        self, record: FileRecord, source_commit: str, source_path: str, *, reverify: bool = False
    ) -> ObjectReceipt | None:
        """Take the object ``source_path`` of published revision ``source_commit`` reads into
        this revision by reference: no byte moves, the revision's object records name that
        object and version (a later overwrite of the key does not reach it; when the version
        is gone, the current one). The object must hold the record's size and sha256 and the
        CRC64NVME S3 checked when it was uploaded, so ``reverify`` needs no read here. The
        prefix gets its own copy only when a server needs one (:meth:`S3Store.materialize`);
        :meth:`commit` makes sure ``source_commit`` was not retired meanwhile."""
        pinned = self._source_receipt(source_commit, source_path)
        source = (self.store._unkey(pinned["key"]) if pinned
                  else f"{revision_prefix(self.repo_id, source_commit)}/{source_path}")
        where = f"{record.path} from {self.store.s3_url(source)}"
        expected = pinned.get("checksum_crc64nvme") if pinned else None
        version = pinned.get("version_id") if pinned else None
        head = self.store.head(source, version) if version and version != "null" else None
        if head is None:
            head = self.store.head(source)
            if head is None:
                raise ReuseFailed(f"{where}: the source object is gone")
            expected = expected or head.get("ChecksumCRC64NVME")
        problems = self._problems(head, record, expected)
        if problems:
            raise ReuseFailed(f"{where}: " + "; ".join(problems))
        self._count(objects_referenced=1, bytes_referenced=record.size)
        found = head.get("VersionId")
        origin = self.store.s3_url(source) + (
            f"?versionId={found}" if found and found != "null" else "")
        receipt = ObjectReceipt(
            path=record.path, key=self.store.key(source), size=int(head["ContentLength"]),
            action="referenced", etag=_etag(head), version_id=found,
            checksum_crc64nvme=head.get("ChecksumCRC64NVME"),
            checksum_type=head.get("ChecksumType"), copied_from=origin,
            referenced_from=source_commit,
        )
        with self._lock:
            self.receipts[record.path] = receipt
        return receipt

    def copy_in(self, record: FileRecord, source: ObjectRecord) -> ObjectReceipt:
        """Copy the object ``source`` names, inside S3, to ``record``'s key in this revision
        and hold the copy to the recorded CRC64NVME (:meth:`S3Store.materialize`)."""
        key = f"{self.prefix}/{record.path}"
        where = f"{record.path} from {self.store.s3_url(source.key)}"
        if not self._try_copy(record, key, source.key, source.version_id):
            raise NotFound(f"{where}: S3 could not copy it (the object is gone)",
                           hint="the revision is damaged: run `k3a verify` on it")
        head = self._checked_head(key, record, source.crc64nvme)
        self._count(objects_copied=1)
        origin = self.store.s3_url(source.key) + (
            f"?versionId={source.version_id}" if source.version_id else "")
        return self._receipt(record, "copied", head, copied_from=origin)

    def _try_copy(self, record: FileRecord, key: str, source: str, version: str | None) -> bool:
        """Server-side copy of ``source`` (at ``version``) to ``key``; False when S3 says the
        source (version) does not exist or cannot be read."""
        with self._lock:
            self._written.add(key)
        copy_source = {"Bucket": self.store.bucket, "Key": self.store.key(source)}
        if version and version != "null":
            copy_source["VersionId"] = version
        what = f"copying {self.store.s3_url(source)} to {self.store.s3_url(key)}"
        with aws_errors(what):
            try:
                with self._manager(record.size) as manager:
                    manager.copy(
                        copy_source, self.store.bucket, self.store.key(key),
                        extra_args={"ChecksumAlgorithm": CHECKSUM_ALGORITHM},
                        subscribers=[self._subscriber(record, "bytes_copied")],
                    ).result()
            except bex.ClientError as exc:
                if http_status(exc) in (400, 403, 404) or error_code(exc) in _GONE:
                    log.info("%s: %s", what, exc)
                    return False
                raise
        return True

    def _delete_target(self, key: str) -> None:
        with aws_errors(f"deleting {self.store.s3_url(key)}"):
            self.store.client.delete_object(Bucket=self.store.bucket, Key=self.store.key(key))

    def _checked_head(self, key: str, record: FileRecord, crc: str | None) -> dict[str, Any]:
        """Read back what S3 stored and hold it to what we sent."""
        head = self.store.head(key)
        if head is None:
            raise VerifyMismatch(f"{self.store.s3_url(key)}: missing right after it was written")
        problems = self._problems(head, record, crc)
        if problems:
            raise VerifyMismatch(
                f"{self.store.s3_url(key)}: " + "; ".join(problems),
                hint="the revision was not published; re-run to upload the file again",
            )
        return head

    def _problems(self, head: dict[str, Any], record: FileRecord, crc: str | None) -> list[str]:
        """How an object S3 describes differs from ``record`` and the CRC64NVME expected."""
        problems = []
        if not self._matches(head, record):
            problems.append(
                f"size/sha256 metadata {head['ContentLength']}/"
                f"{head.get('Metadata', {}).get(META_SHA256)} != {record.size}/{record.sha256}"
            )
        stored = head.get("ChecksumCRC64NVME")
        if stored is None:
            problems.append("S3 stored no CRC64NVME checksum")
        elif crc is not None and stored != crc:
            problems.append(f"S3 stored CRC64NVME {stored}, we computed {crc}")
        return problems

    def _check_complete(self, manifest: ShardManifest) -> None:
        missing = []
        for record in manifest.files:
            if record.path in self.receipts:
                continue
            head = self.store.head(f"{self.prefix}/{record.path}")
            if not self._matches(head, record):
                missing.append(record.path)
            else:
                assert head is not None
                self._receipt(record, "kept", head)
        if missing:
            raise K3AError(
                f"{self.repo_id}@{self.commit_sha}: {len(missing)} file(s) of the manifest are "
                f"not in the store: {', '.join(missing[:5])}",
                hint="put every file before committing (a bug in the caller)",
            )

    def commit(self, manifest: ShardManifest) -> None:
        if (manifest.repo_id, manifest.commit) != (self.repo_id, self.commit_sha):
            raise ConfigError(
                f"manifest is for {manifest.repo_id}@{manifest.commit}, writer for "
                f"{self.repo_id}@{self.commit_sha}"
            )
        self._close_pool()  # every file is finished by now: its threads have nothing to do
        existing = self.store.read_manifest(self.repo_id, self.commit_sha)
        if existing is not None:
            self._same_or_conflict(existing, manifest)
            return
        self._check_complete(manifest)
        receipts = [dataclasses.asdict(self.receipts[r.path]) for r in manifest.files]
        with aws_errors(f"writing {self.store.s3_url(self.prefix)}/{OBJECT_RECORDS_REL}"):
            self.store._put_small(
                f"{self.prefix}/{OBJECT_RECORDS_REL}",
                canonical_json({"manifest_sha256": manifest.digest(), "objects": receipts}),
            )
        self._check_references_live()
        faultpoints.pause("references-checked", self.commit_sha)
        # Beside the manifest, before it: where this store's bytes came from (not digested).
        pkey = provenance_key(self.repo_id, self.commit_sha)
        with aws_errors(f"writing {self.store.s3_url(pkey)}"):
            self.store._put_small(pkey, manifest.provenance().canonical())
        try:
            self.store.create(manifest_key(self.repo_id, self.commit_sha), manifest.canonical())
        except AlreadyExists:
            raced = self.store.read_manifest(self.repo_id, self.commit_sha)
            assert raced is not None
            self._same_or_conflict(raced, manifest)

    def _check_references_live(self) -> None:
        """After this revision's records are written, every revision it references must still
        be published. gc deletes a manifest before it reads everyone's records
        (:meth:`S3Store.delete_revision`): a source found published here was not yet being
        deleted when our records became visible, so its deletion keeps what they name."""
        with self._lock:
            sources = {r.referenced_from for r in self.receipts.values() if r.referenced_from}
        gone = sorted(c for c in sources
                      if self.store.read(manifest_key(self.repo_id, c)) is None)
        if gone:
            self.store.delete(f"{self.prefix}/{OBJECT_RECORDS_REL}")
            raise Conflict(
                f"{self.repo_id}@{self.commit_sha}: files were reused from "
                f"{', '.join(c[:12] for c in gone)}, retired (k3a revision gc) while this run "
                "staged; nothing was published",
                hint="re-run `k3a stage`: it plans again from the revisions still published",
            )

    def _same_or_conflict(self, existing: ShardManifest, manifest: ShardManifest) -> None:
        if existing.digest() != manifest.digest():
            raise Conflict(
                f"{self.store.location(self.repo_id, self.commit_sha)} is already published "
                f"with a different manifest ({existing.digest()} != {manifest.digest()}); "
                "refusing to overwrite",
                hint="a published revision is immutable; investigate why staging differs",
            )

    def abort(self) -> None:
        """Drop the objects this writer put and any multipart upload under the revision.

        Nothing here was ever visible (no manifest). Deletes a bucket policy refuses (the
        production policy lets only an admin delete under ``models/``) are left in
        ``abort_leftovers``: harmless, and the next run of this revision keeps them.
        """
        self._close_pool()
        if self.store.read_manifest(self.repo_id, self.commit_sha) is not None:
            return  # published (by us or a peer): nothing of it is ours to drop any more
        self.store.abort_multipart_uploads(self.prefix)
        with self._lock:
            written = sorted(self._written)
            self._written.clear()
        try:
            self.abort_leftovers = self.store._delete_keys(written)
        except K3AError as exc:
            log.warning("abort could not delete objects of %s: %s", self.prefix, exc)
            self.abort_leftovers = written
        if self.abort_leftovers:
            log.warning("abort left %d object(s) under %s (not visible: no manifest)",
                        len(self.abort_leftovers), self.prefix)
