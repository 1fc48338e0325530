"""The S3 store: revisions over the bucket's records, read through their object records, shared
by reference, materialized, repaired and retired.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import ConfigError, Conflict
from k3artifacts.revisions.manifest import FileRecord, ShardManifest, manifest_key, revision_prefix
from k3artifacts.stores.awsclients import aws_errors
from k3artifacts.stores.base import (
    OBJECT_RECORDS_REL,
    NotPublished,
    ObjectRecord,
    Placement,
    RangeReader,
)
from k3artifacts.stores.s3.objects import ObjectReceipt, etag
from k3artifacts.stores.s3.ranges import S3Ranges
from k3artifacts.stores.s3.records import S3Records
from k3artifacts.stores.s3.writer import S3RevisionWriter

log = logging.getLogger(__name__)


class S3Store(S3Records):
    """``s3://bucket/prefix`` through botocore + s3transfer.

    ``counters`` sum every writer's transfers; ``progress`` is handed to each new writer.
    """

    wanted_checksums = frozenset({"crc64nvme"})
    regional = True

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
                key=self.unkey(obj["key"]),
                size=int(obj["size"]),
                version_id=version if version and version != "null" else None,
                crc64nvme=crc if crc and full else None,
                etag=obj.get("etag"),
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

    def open_ranges(self, repo_id: str, commit: str, connections: int) -> RangeReader:
        return S3Ranges(self, revision_prefix(repo_id, commit),
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
        refused = set(self.delete_keys(sorted(doomed)))
        return sum(size for key, size in doomed.items() if key not in refused)

    def repair_file(self, repo_id: str, commit: str, record: FileRecord,
                    local_path: Path) -> None:
        """Upload the file under the revision's own prefix (a new version) and record that
        version as the object it reads, where its record named a damaged object (its own, or
        another revision's by reference).

        Objects under a revision are create-once (a bootstrapped bucket refuses any other
        write), so whatever is at the key is deleted first: an admin action, as the bucket
        lets only the admin delete under ``models/``; the deleted version stays, noncurrent,
        until the lifecycle rule expires it."""
        self.published_manifest(repo_id, commit)
        prefix = revision_prefix(repo_id, commit)
        key = f"{prefix}/{record.path}"
        if self.head(key) is not None and self.delete_keys([key]):
            raise ConfigError(
                f"{self.s3_url(key)}: the bucket refused to delete the damaged object, which "
                "a repair replaces",
                hint="run `k3a stage --repair` with the admin role's credentials: only the "
                "admin may delete under models/",
            )
        writer = S3RevisionWriter(self, repo_id, commit)
        receipt = writer._upload(record, key, local_path, None)
        # A revision without records reads its prefix, which now holds the file.
        self._point_records_at(repo_id, commit, {record.path: receipt})

    def _point_records_at(self, repo_id: str, commit: str,
                          receipts: Mapping[str, ObjectReceipt]) -> bool:
        """Make the revision's object records name, for each path in ``receipts``, the object
        its receipt describes (compare-and-swap: :class:`Conflict` when the records moved
        meanwhile). False when the revision keeps no records."""
        key = f"{revision_prefix(repo_id, commit)}/{OBJECT_RECORDS_REL}"
        found = self.read(key)
        if found is None:
            return False
        body = json.loads(found.data)
        for obj in body["objects"]:
            receipt = receipts.get(obj["path"])
            if receipt is not None:
                obj.clear()
                obj.update(dataclasses.asdict(receipt))
        self.replace(key, canonical_json(body), found.token)
        return True

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
            self.refuse_unserved(repo_id, commit)
            return 0
        manifest = self.published_manifest(repo_id, commit)
        writer = S3RevisionWriter(self, repo_id, commit)
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="k3a-materialize") as pool:
            list(pool.map(lambda r: writer.copy_in(manifest.file(r.path), r), outside))
        try:
            self._point_records_at(repo_id, commit, writer.receipts)
        except Conflict:
            pass  # another materialize recorded its copies first: the same objects
        self.refuse_unserved(repo_id, commit)
        return sum(r.size for r in outside)

    def check_served(self, repo_id: str, commit: str, manifest: ShardManifest, *,
                     workers: int = 16) -> dict[str, str]:
        """HyperPod's ``s3Storage`` (a Mountpoint volume, an FSx import) reads whatever is
        current under the revision's prefix, where every reader through the object records
        reads the versions recorded at publication. So each file's current object under the
        prefix must be the object its record names: that key, the recorded version (on a
        bucket without versions, the recorded ETag), the manifest's size and the recorded
        CRC64NVME. One HEAD per file, many at once; no byte read."""
        records = self.object_records(repo_id, commit)
        prefix = revision_prefix(repo_id, commit)

        def served(file: FileRecord) -> str | None:
            record = records.get(file.path)
            key = f"{prefix}/{file.path}"
            if record is None:
                return "no object record names it"
            if record.key != key:
                return (f"the prefix does not hold it (read from {record.key} by reference); "
                        "materialize the revision (k3a tuple create does)")
            head = self.head(key)
            if head is None:
                return "no current object under the prefix"
            current = head.get("VersionId")
            if record.version_id is not None and current != record.version_id:
                return (f"the current object is version {current}, not {record.version_id} as "
                        "recorded: it was replaced after publication")
            if record.version_id is None and record.etag and etag(head) != record.etag:
                return (f"the current object has ETag {etag(head)}, not {record.etag} as "
                        "recorded: it was replaced after publication")
            if int(head["ContentLength"]) != file.size:
                return f"the current object is {head['ContentLength']} bytes, not {file.size}"
            stored = head.get("ChecksumCRC64NVME")
            if record.crc64nvme is not None and stored != record.crc64nvme:
                return (f"the current object has CRC64NVME {stored}, not {record.crc64nvme} as "
                        "recorded")
            return None

        with ThreadPoolExecutor(max(1, min(workers, len(manifest.files))),
                                thread_name_prefix="k3a-served") as pool:
            found = zip(manifest.files, pool.map(served, manifest.files), strict=True)
            return {file.path: why for file, why in found if why is not None}
