"""The store interface: where published revisions and release records live.

Implementations: :mod:`.file` (a POSIX tree: local disk or an FSx mount) and :mod:`.s3`;
:func:`k3artifacts.stores.registry.open_store` picks one from a URL. Two kinds of content share
one key space (docs/architecture.md, "Storage layout"):

* revisions: ``models/<org>/<name>/<commit>/...``, large, written once through a
  :class:`RevisionWriter` and visible only once complete (``.k3a/manifest.json`` exists);
* small records: tuples, channel pointers, history. Written with :meth:`Store.create`
  (exclusive: never overwrites) or :meth:`Store.replace` (compare-and-swap on a version token).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from k3artifacts.errors import NotFound
from k3artifacts.revisions.manifest import (
    META_DIR,
    FileRecord,
    Provenance,
    ShardManifest,
    manifest_key,
    provenance_key,
    revision_prefix,
)

#: Files below this size are not synced one by one (an fsync is ~10 ms, the largest cost of
#: staging thousands of small files): quarantine re-hashes them before reusing them after a
#: crash, and the file store syncs them with one syncfs before the manifest is written.
SMALL_FILE = 16 << 20


@dataclass(frozen=True)
class PutReceipt:
    """What the store did with one file of a revision; staging sums these into its report,
    whichever process put the file."""

    path: str
    size: int
    #: "uploaded" (bytes sent), "copied" (inside the store), "kept" (already there), or
    #: "stored" (placed in a file tree: a hard link from quarantine, else a copy).
    action: str


def receipt_stats(receipts: list[PutReceipt | None]) -> dict[str, int]:
    """Transfer counters of a revision from its receipts (a file store returns none)."""
    stats: dict[str, int] = {}
    names = {"uploaded": "uploaded", "copied": "copied", "kept": "skipped", "stored": "stored"}
    for receipt in receipts:
        if receipt is None or receipt.action not in names:
            continue
        name = names[receipt.action]
        stats[f"objects_{name}"] = stats.get(f"objects_{name}", 0) + 1
        if name != "skipped":
            stats[f"bytes_{name}"] = stats.get(f"bytes_{name}", 0) + receipt.size
    return stats


class ReuseFailed(Exception):
    """A file of a published revision could not be reused for a new one (source gone, or the
    copy the store made does not match the record); the caller downloads the file instead."""


@dataclass(frozen=True)
class Versioned:
    data: bytes
    #: Opaque version of ``data``: pass it back to :meth:`Store.replace` to compare-and-swap.
    token: str


class RevisionWriter(ABC):
    """Accumulates one revision's files; nothing is visible to readers until :meth:`commit`."""

    @abstractmethod
    def put_file(
        self, record: FileRecord, local_path: Path, *, checksums: Mapping[str, str] | None = None
    ) -> PutReceipt | None:
        """Add a verified file. ``local_path`` is left in place (the caller owns quarantine).

        ``checksums`` carries digests computed while the file was downloaded (those named in
        :attr:`Store.wanted_checksums`), so the store need not read the file to compute them.
        Writers of one revision may run in several processes at once (one per staging worker):
        a put has no effect on any other writer's puts.
        """

    def adopt(self, record: FileRecord) -> PutReceipt | None:
        """If an earlier, interrupted run already stored this exact file, take it into this
        revision and say so (a "kept" receipt); the caller then need not have the bytes."""
        return None

    def reuse(
        self, record: FileRecord, source_commit: str, source_path: str, *, reverify: bool = False
    ) -> PutReceipt | None:
        """Put ``record`` into this revision from ``source_path`` of the published revision
        ``source_commit`` of the same repo, inside the store: no byte passes through this
        machine. Then hold what the store reports for the new file to ``record`` (size, and
        the store's own checksum where it keeps one; ``reverify``: re-hash it where the store
        cannot say). Returns a "copied" receipt, or None when the revision was published
        meanwhile; raises :class:`ReuseFailed` (having left nothing at the target) when the
        source is gone or the copy does not match, so that the caller downloads the file."""
        raise ReuseFailed(f"{type(self).__name__} cannot reuse files")

    @abstractmethod
    def open_staged(self, path: str) -> BinaryIO:
        """Read back a file put into this revision before it is committed (the staging
        coordinator reads the index and license this way when a worker on another machine
        fetched them)."""

    def stats(self) -> dict[str, int]:
        """Transfer counters of this revision (bytes uploaded, copied...), for reports."""
        return {}

    @abstractmethod
    def commit(self, manifest: ShardManifest) -> None:
        """Make the revision visible, manifest last. Idempotent for an identical manifest.

        Files put that the manifest does not list are dropped."""

    @abstractmethod
    def abort(self) -> None:
        """Drop whatever was written; readers never saw any of it."""


class Store(ABC):
    url: str
    #: Digests, beyond sha256 and xxh3-128, the store wants computed as bytes arrive.
    wanted_checksums: frozenset[str] = frozenset()

    @abstractmethod
    def exists(self) -> bool:
        """Whether the store is there at all (a directory, a bucket holding the prefix).

        Read commands refuse a store that is not: a mistyped path would otherwise look like
        an empty store. Raises :class:`~k3artifacts.errors.Unavailable` when it cannot tell
        (an S3 endpoint that does not answer)."""

    # ---- small records -------------------------------------------------------------------
    @abstractmethod
    def read(self, key: str) -> Versioned | None: ...

    @abstractmethod
    def create(self, key: str, data: bytes) -> None:
        """Write ``key`` only if absent; raise :class:`AlreadyExists` otherwise."""

    @abstractmethod
    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        """Compare-and-swap: write ``key`` only if its token is ``expected`` (None: absent).

        Returns the new token; raises :class:`Conflict` when another writer got there first.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the small record ``key``; absent is not an error. Only for records that live
        while an operation runs (retention's pins and tombstones), never tuples or history."""

    @abstractmethod
    def modified_at(self, key: str) -> datetime | None:
        """When ``key`` was last written, or None when absent (one metadata request)."""

    @abstractmethod
    def list_keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (a folder-like prefix ending in ``/``), sorted."""

    @abstractmethod
    def object_sizes(self, prefix: str) -> dict[str, int]:
        """Every key under ``prefix`` with its size in bytes, from one listing (no reads).

        What the promotion gate uses to check a published revision cheaply; on S3 the
        ListObjectsV2 pages already carry each object's size.
        """

    # ---- revisions -----------------------------------------------------------------------
    @abstractmethod
    def begin_revision(self, repo_id: str, commit: str) -> RevisionWriter:
        """A writer for one revision. Opening one has no side effect on other writers."""

    def clean_incomplete(self, repo_id: str, commit: str) -> int:
        """Drop what crashed runs of this revision left half-written (S3: multipart uploads);
        returns how many. Staging runs it once, at the start of a run that holds the revision,
        never while another writer of it may be putting files."""
        return 0

    @abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """A streaming reader of a stored object; raises :class:`NotFound`."""

    @abstractmethod
    def delete_revision(self, repo_id: str, commit: str) -> None:
        """Remove a published revision (an admin action, e.g. retention)."""

    def add_to_revision(self, repo_id: str, commit: str, rel: str, data: bytes) -> None:
        """Create ``<revision>/<rel>`` once in a published revision, touching nothing else.

        For metadata that may come after publication (a signature in ``.k3a/``). Raises
        :class:`NotFound` if the revision is not published, :class:`AlreadyExists` if ``rel``
        is already there.
        """
        if self.read_manifest(repo_id, commit) is None:
            raise NotFound(f"{repo_id}@{commit} is not published in {self.url}")
        self.create(f"{revision_prefix(repo_id, commit)}/{rel}", data)

    def local_path(self, key: str) -> Path | None:
        """The POSIX path of ``key`` when the store is a mounted tree, else None."""
        return None

    #: A POSIX tree that every staging worker mounts (local disk, FSx): workers then share the
    #: quarantine beside it. Otherwise (S3) each worker keeps its own local quarantine.
    mounted_tree: bool = False

    def read_manifest(self, repo_id: str, commit: str) -> ShardManifest | None:
        found = self.read(manifest_key(repo_id, commit))
        return None if found is None else ShardManifest.parse(found.data)

    def read_provenance(self, repo_id: str, commit: str) -> Provenance | None:
        """Where the bytes of this store's copy came from (None for revisions published
        before provenance moved beside the manifest: theirs is inside it)."""
        found = self.read(provenance_key(repo_id, commit))
        return None if found is None else Provenance.parse(found.data)

    def list_revisions(self, repo_id: str) -> list[str]:
        """Commits of ``repo_id`` that are published (their manifest exists)."""
        suffix = f"/{META_DIR}/manifest.json"
        prefix = f"models/{repo_id}/"
        return sorted(
            key[len(prefix) : -len(suffix)]
            for key in self.list_keys(prefix)
            if key.endswith(suffix) and "/" not in key[len(prefix) : -len(suffix)]
        )

    def location(self, repo_id: str, commit: str) -> str:
        """Where a server reads this revision from: a path or an ``s3://`` URL."""
        return f"{self.url.rstrip('/')}/{revision_prefix(repo_id, commit)}"
