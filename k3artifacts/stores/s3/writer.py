"""Writing a revision: the revision writer, and a large file's multipart upload streamed while
it downloads.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import botocore.exceptions as bex
from awscrt import checksums as crt_checksums
from botocore.handlers import add_expect_header, convert_body_to_file_like_object

from k3artifacts import faultpoints
from k3artifacts.canonical import canonical_json
from k3artifacts.errors import (
    AlreadyExists,
    ConfigError,
    Conflict,
    K3AError,
    NotFound,
    VerifyMismatch,
)
from k3artifacts.revisions.manifest import (
    FileRecord,
    ShardManifest,
    manifest_key,
    provenance_key,
    revision_prefix,
)
from k3artifacts.stores.awsclients import aws_errors, error_code, http_status
from k3artifacts.stores.base import (
    OBJECT_RECORDS_REL,
    ObjectRecord,
    ProgressCallback,
    ReuseFailed,
    RevisionWriter,
    ShortRead,
    StreamedPut,
)
from k3artifacts.stores.s3.objects import (
    CHECKSUM_ALGORITHM,
    DIGEST_ERRORS,
    GONE,
    META_SHA256,
    META_XXH3,
    TAKEN,
    ObjectReceipt,
    crc64nvme_and_sha256,
    etag,
)
from k3artifacts.stores.s3.records import S3Records
from k3artifacts.stores.s3.transfers import MiB, Progress, TransferCounters

if TYPE_CHECKING:
    from s3transfer.manager import TransferManager

log = logging.getLogger(__name__)

#: How far behind the downloaded offset a streamed part must end. The downloader writes through
#: a buffered file object that holds at most its buffer (st_blksize, a few KiB) back from the
#: OS; a part ending a MiB behind is in the page cache, where our own pread sees it.
STREAM_LAG = 1 * MiB


def _b64_crc(crc: int) -> str:
    return base64.b64encode(crc.to_bytes(8, "big")).decode("ascii")


class _PartBody:
    """One part's bytes as an UploadPart body, straight from the buffer the store lent
    (:class:`~.transfers.PartBuffers`): sent with one ``sendall``, no copy, the interpreter
    lock released, and read again from the start on a retry.

    ``read`` hands over the rest of the part whatever size is asked: urllib3 reads a body in
    16 KiB blocks, a Python iteration each under the lock (a thousand per part), where the
    part is already whole in memory. ``readinto`` keeps to its buffer, for any reader that
    fills one. Only the part client (:meth:`S3RevisionWriter.part_client`) is given one."""

    def __init__(self, data: memoryview):
        self._data = data
        self._pos = 0

    def __len__(self) -> int:
        return len(self._data)

    def read(self, size: int = -1) -> memoryview:
        chunk = self._data[self._pos:]
        self._pos = len(self._data)
        return chunk

    def readinto(self, buf: memoryview) -> int:
        n = min(len(buf), len(self._data) - self._pos)
        buf[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: len(self._data)}[whence]
        self._pos = min(max(0, base + offset), len(self._data))
        return self._pos

    def tell(self) -> int:
        return self._pos


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
            with self.store.part_buffers.lend(length) as data:
                done = 0
                while done < length:  # short reads happen on some filesystems
                    n = os.preadv(self._fd, [data[done:]], offset + done)
                    if not n:
                        raise ShortRead(f"{self.local_path}: ended at {offset + done}")
                    done += n
                crc = crt_checksums.crc64nvme(data)
                resp = self.writer.part_client().upload_part(
                    Bucket=self.store.bucket, Key=self.s3_key, UploadId=upload_id,
                    PartNumber=number, Body=_PartBody(data), ChecksumCRC64NVME=_b64_crc(crc),
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
        taken = False
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
                        IfNoneMatch="*",
                    )
                except bex.ClientError as exc:
                    if http_status(exc) in TAKEN:
                        taken = True
                    elif error_code(exc) not in DIGEST_ERRORS:
                        raise
                    else:
                        raise VerifyMismatch(
                            f"s3://{self.store.bucket}/{self.s3_key}: S3 refused the upload: "
                            f"the bytes it received do not match CRC64NVME {crc} "
                            f"({error_code(exc)})",
                            hint="corrupted in transit; nothing was published, re-run",
                        ) from None
        except BaseException:
            self.cancel()
            raise
        if taken:
            self.cancel()
            return self.writer.taken(record, self.key, crc)
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

    def __init__(self, store: S3Records, repo_id: str, commit: str):
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
            etag=etag(head),
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
        return self.store.open_version(*self._staged(path))

    def read_staged(self, path: str, offset: int, length: int) -> bytes:
        return self.store.read_range(*self._staged(path), offset, length)

    def _staged(self, path: str) -> tuple[str, str | None]:
        """Key and version of the object this revision reads for ``path``: another
        revision's, at its recorded version, for a file taken by reference; else the one
        under the revision's prefix."""
        with self._lock:
            receipt = self.receipts.get(path)
        if receipt is not None and receipt.referenced_from:
            version = receipt.version_id if receipt.version_id != "null" else None
            return self.store.unkey(receipt.key), version
        return f"{self.prefix}/{path}", None

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

    def _subscriber(self, record: FileRecord, field_name: str) -> Progress:
        return Progress(record.path, [self.counters, self.store.counters], field_name,
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
        if self.store.tuning.put_in_parts(size):
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
        self.note_written(key)
        s3_key = self.store.key(key)
        with aws_errors(f"uploading {local_path} to s3://{self.store.bucket}/{s3_key}"):
            try:
                # One PUT (a file below one part), create-once: the store never replaces an
                # object under a revision, and a bootstrapped bucket refuses a PUT that would.
                with open(local_path, "rb") as body:
                    self.store.client.put_object(
                        Bucket=self.store.bucket, Key=s3_key, Body=body, Metadata=metadata,
                        ChecksumAlgorithm=CHECKSUM_ALGORITHM, ChecksumCRC64NVME=crc,
                        IfNoneMatch="*",
                    )
            except bex.ClientError as exc:
                if http_status(exc) in TAKEN:
                    return self.taken(record, key, crc)
                if error_code(exc) not in DIGEST_ERRORS:
                    raise
                raise VerifyMismatch(
                    f"s3://{self.store.bucket}/{s3_key}: S3 refused the upload of {local_path}:"
                    f" the bytes it received do not match CRC64NVME {crc} ({error_code(exc)})",
                    hint="the file changed during the upload or was corrupted in transit; "
                    "nothing was published, re-run",
                ) from None
        self.sent(record.path, size)
        return self.finish_upload(record, key, crc)

    def taken(self, record: FileRecord, key: str, crc: str | None) -> ObjectReceipt:
        """A create-once put of ``key`` was refused because an object is there: another writer
        of this revision put the same file first (then it is kept, as a re-run keeps it), or
        the key holds other bytes, which the store never replaces."""
        with self._lock:
            self._written.discard(key)  # not ours: an abort must leave it
        head = self.store.head(key)
        if head is None:
            raise Conflict(
                f"{self.store.s3_url(key)}: another writer is putting {record.path} right now",
                hint="another run is staging the same revision; re-run once it has finished",
            )
        problems = self._problems(head, record, crc)
        if problems:
            raise Conflict(
                f"{self.store.s3_url(key)} already holds an object that is not "
                f"{record.path}: " + "; ".join(problems),
                hint="objects under models/ are never replaced: an admin deletes that one "
                "(the bucket keeps its versions), then re-run",
            )
        self._count(objects_skipped=1)
        return self._receipt(record, "kept", head)

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
        per file put at once (one pool of 8 for 8 files in flight kept every download waiting
        on its last parts: a single S3 connection moves far less than a file's download
        does), but no more than the store's part buffers hold parts. The buffers in memory
        are bounded by that budget in bytes (each part holds its size of it while it is read
        and sent), not by parts times files: 8 parts of 16 MiB for each of 8 files in flight
        peaked at 1.35 GiB of RSS on 16 cores."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._senders(),
                                                thread_name_prefix="k3a-s3-part")
            return self._pool

    def _senders(self) -> int:
        tuning = self.store.tuning
        return max(1, min(tuning.max_concurrency * self._files_at_once,
                          tuning.buffer_bytes // tuning.stream_part_size))

    def part_client(self) -> Any:
        """The client the streamed parts go through: a connection per part thread, and
        bodies sent as ``UNSIGNED-PAYLOAD`` whatever the scheme. Each part carries its
        CRC64NVME in a signed header, which S3 checks, and the parts' CRCs must combine to the
        CRC of the bytes verified against upstream's sha256 before the upload is completed:
        a payload SHA256 would prove nothing more. Over HTTPS botocore already leaves such a
        body unsigned; over plain HTTP (an in-cluster store) it hashed every part inside the
        CRT signer while holding the interpreter lock: 55% of the lock's time in a 16-core
        profile of staging to SeaweedFS, the run's serial section.

        A part goes out of the buffer it was read into (:class:`_PartBody`, one ``sendall``,
        the lock released): botocore's stock handler would wrap it in a BytesIO, a copy
        that urllib3 then sends 16 KiB per Python iteration under the lock, and the CRT
        signer copies any body without ``seek`` into a BytesIO (16 MiB per part under the
        lock, measured worse). Nor does a part wait for ``100 Continue``, which botocore asks
        of any body with ``read``: the server's answer to a part comes after its bytes."""
        with self._lock:
            if self._part_client is None:
                client = self.store.companion_client(self._senders(), sign_payload=False)
                client.meta.events.unregister("before-parameter-build.s3.UploadPart",
                                              convert_body_to_file_like_object)
                client.meta.events.unregister("before-call.s3", add_expect_header)
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
        source = (self.store.unkey(pinned["key"]) if pinned
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
            action="referenced", etag=etag(head), version_id=found,
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
        copied = self._try_copy(record, key, source.key, source.version_id)
        if copied == "taken":
            return self.taken(record, key, source.crc64nvme)  # an earlier materialize's copy
        if copied == "gone":
            raise NotFound(f"{where}: S3 could not copy it (the object is gone)",
                           hint="the revision is damaged: run `k3a verify` on it")
        head = self._checked_head(key, record, source.crc64nvme)
        self._count(objects_copied=1)
        origin = self.store.s3_url(source.key) + (
            f"?versionId={source.version_id}" if source.version_id else "")
        return self._receipt(record, "copied", head, copied_from=origin)

    def _try_copy(self, record: FileRecord, key: str, source: str,
                  version: str | None) -> Literal["copied", "gone", "taken"]:
        """Server-side copy of ``source`` (at ``version``) to ``key``, create-once (the bucket's
        client adds ``If-None-Match``): "gone" when S3 says the source (version) does not exist
        or cannot be read, "taken" when an object is at ``key`` already."""
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
                if http_status(exc) in TAKEN:
                    return "taken"
                if http_status(exc) in (400, 403, 404) or error_code(exc) in GONE:
                    log.info("%s: %s", what, exc)
                    return "gone"
                raise
        return "copied"

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
        self.store.rewrite(
            f"{self.prefix}/{OBJECT_RECORDS_REL}",
            canonical_json({"manifest_sha256": manifest.digest(), "objects": receipts}),
        )
        self._check_references_live()
        faultpoints.pause("references-checked", self.commit_sha)
        # Beside the manifest, before it: where this store's bytes came from (not digested).
        self.store.rewrite(provenance_key(self.repo_id, self.commit_sha),
                           manifest.provenance().canonical())
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
            self.abort_leftovers = self.store.delete_keys(written)
        except K3AError as exc:
            log.warning("abort could not delete objects of %s: %s", self.prefix, exc)
            self.abort_leftovers = written
        if self.abort_leftovers:
            log.warning("abort left %d object(s) under %s (not visible: no manifest)",
                        len(self.abort_leftovers), self.prefix)
