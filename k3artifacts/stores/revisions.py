"""The revision store: published revisions, written once through a writer, read many ways.

What ``staging/`` needs of a store (and the node cache, verification, renders): a
:class:`RevisionWriter` per revision (``models/<org>/<name>/<commit>/...``, visible only once
``.k3a/manifest.json`` exists), manifests, files and ranges, the store's object records,
where a server reads a revision (placement, materialization, what the place serves), and
the admin's deletes and repairs. Small records (tuples, pointers) are the :mod:`.records`
interface; :class:`~k3artifacts.stores.base.Store`, what ``open_store`` returns, is both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from k3artifacts.errors import NotFound, VerifyMismatch
from k3artifacts.revisions.manifest import (
    MANIFEST_NAME,
    META_DIR,
    FileRecord,
    Provenance,
    ShardManifest,
    revision_prefix,
)

#: Files below this size are not synced one by one (an fsync is ~10 ms, the largest cost of
#: staging thousands of small files): quarantine re-hashes them before reusing them after a
#: crash, and the file store syncs them with one syncfs before the manifest is written.
SMALL_FILE = 16 << 20

#: A revision's record of where each of its files' bytes live in the store (key, version,
#: the checksum the store computed), written by the store beside the manifest and never part
#: of the release's content: the manifest's digest does not depend on how bytes got there.
#: (The name predates other stores keeping one.)
OBJECT_RECORDS_NAME = "s3-objects.json"
OBJECT_RECORDS_REL = f"{META_DIR}/{OBJECT_RECORDS_NAME}"

#: ``progress(path, nbytes)``: ``nbytes`` more bytes of ``path`` reached the store (negative
#: when a retried part is rewound). Called from transfer threads.
ProgressCallback = Callable[[str, int], None]

#: ``sink(view)``: the next bytes of a range, in order; ``view`` is reused after it returns.
Sink = Callable[[memoryview], None]


class NotPublished(NotFound):
    """The one answer to "read revision R" when R has no manifest in the store."""

    def __init__(self, repo_id: str, commit: str, store_url: str, *, hint: str | None = None):
        super().__init__(
            f"{repo_id}@{commit} is not published in {store_url}",
            hint=hint or "stage it first (`k3a stage`), or check the commit and --store",
        )


class ShortRead(Exception):
    """The store gave fewer bytes than asked for: retried, then reported."""


@dataclass(frozen=True)
class ObjectRecord:
    """Where one file of a revision lives in the store, as the store recorded it."""

    path: str
    #: The object's key, relative to the store root.
    key: str
    size: int
    #: The object version the revision reads (None: the store keeps no versions).
    version_id: str | None = None
    #: The store's own whole-object CRC64NVME (base64), where it computed one.
    crc64nvme: str | None = None
    #: The object's ETag as recorded: what tells a replaced object on a store that keeps no
    #: versions.
    etag: str | None = None


class RangeReader(ABC):
    """Positioned reads of one published revision's files: the byte source of a pull.

    Memory stays flat: bytes pass through the caller's reusable buffer, any number of threads
    may read at once, and each read asks the store for exactly the range wanted."""

    #: Extra whole-file checksums the store recorded (path -> {"crc64nvme": base64}).
    checksums: dict[str, dict[str, str]]

    @abstractmethod
    def read_range(self, path: str, offset: int, length: int, buf: memoryview,
                   sink: Sink) -> None:
        """Pass the ``length`` bytes of ``path`` at ``offset`` to ``sink`` in order, through
        ``buf``, or raise (:class:`ShortRead`, :class:`NotFound`, ``Unavailable``)."""

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class Placement:
    """Where a revision's weights live for a server: what a render mounts."""

    #: The store the revision is in (its URL, as :func:`~.registry.open_store` takes it).
    store_url: str
    #: The revision's directory under the store root (``models/<org>/<name>/<commit>``).
    revision_path: str
    #: S3 bucket and key prefix of the store root; None for a POSIX tree.
    bucket: str | None = None
    s3_prefix: str = ""
    #: POSIX path of the store root; None for S3.
    root_path: str | None = None


@dataclass(frozen=True)
class PutReceipt:
    """What the store did with one file of a revision; staging sums these into its report,
    whichever process put the file."""

    path: str
    size: int
    #: "uploaded" (bytes sent), "copied" (inside the store), "kept" (already there),
    #: "stored" (placed in a file tree: a hard link from quarantine, else a copy), or
    #: "referenced" (the revision reads bytes a published one keeps: none moved).
    action: str


def receipt_stats(receipts: list[PutReceipt | None]) -> dict[str, int]:
    """Transfer counters of a revision from its receipts (a file store returns none)."""
    stats: dict[str, int] = {}
    names = {"uploaded": "uploaded", "copied": "copied", "kept": "skipped", "stored": "stored",
             "referenced": "referenced"}
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


class StreamedPut(ABC):
    """A file handed to the store while it is still being downloaded (see
    :meth:`RevisionWriter.begin_put`): its bytes go out as they land, not in a second read of
    the whole file after it was verified. Nothing of it is visible until :meth:`finish`."""

    @abstractmethod
    def written(self, upto: int) -> None:
        """Bytes ``[0, upto)`` of the local file hold what will be verified (not necessarily
        durable yet). Called from the downloading thread; must return quickly."""

    @abstractmethod
    def finish(
        self, record: FileRecord, checksums: Mapping[str, str], local_path: Path
    ) -> PutReceipt | None:
        """The file is complete and verified as ``record`` and lies at ``local_path`` now (a
        verified file is moved out of its partial name): send the rest and make it a file of
        the revision. None when what was sent cannot be proven to be the verified bytes (the
        file changed under us, or a download restarted from zero): nothing was put, the caller
        puts the file whole."""

    @abstractmethod
    def cancel(self) -> None:
        """The download failed or was refused: drop whatever was sent."""


class RevisionWriter(ABC):
    """Accumulates one revision's files; nothing is visible to readers until :meth:`commit`."""

    def begin_put(
        self, path: str, size: int, sha256: str, local_path: Path
    ) -> StreamedPut | None:
        """Start putting a file of ``size`` bytes, expected to hash to ``sha256`` (upstream's
        LFS digest), that is being downloaded to ``local_path``; or None when this store takes
        files whole through :meth:`put_file` (a file tree links the verified file: there is
        nothing to overlap)."""
        return None

    def expect_files(self, files: int) -> None:
        """Up to ``files`` files will be put at once (the staging jobs of this process). A
        writer that sends each file's parts in parallel sizes its pool from it; one that takes
        files whole has nothing to size."""
        return None

    @abstractmethod
    def put_file(
        self, record: FileRecord, local_path: Path, *, checksums: Mapping[str, str] | None = None
    ) -> PutReceipt | None:
        """Add a verified file. ``local_path`` is left in place (the caller owns quarantine).

        ``checksums`` carries digests computed while the file was downloaded (those named in
        :attr:`RevisionStore.wanted_checksums`), so the store need not read the file to
        compute them.
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
        cannot say). Returns a "copied" or "referenced" receipt (see
        docs/architecture.md, "Storage layout"), or None when the revision was published
        meanwhile; raises :class:`ReuseFailed` (having left nothing at the target) when the
        source is gone or the copy does not match, so that the caller downloads the file."""
        raise ReuseFailed(f"{type(self).__name__} cannot reuse files")

    @abstractmethod
    def open_staged(self, path: str) -> BinaryIO:
        """Read back a file put into this revision before it is committed (the staging
        coordinator reads the index and license this way when a worker on another machine
        fetched them)."""

    @abstractmethod
    def read_staged(self, path: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` of a file put into this revision (fewer at its
        end), reading no other byte of it: a reused shard's header is a few KB of a
        multi-GB object."""

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


class RevisionStore(ABC):
    url: str
    #: Digests, beyond sha256 and xxh3-128, the store wants computed as bytes arrive.
    wanted_checksums: frozenset[str] = frozenset()
    #: Whether the store lives in a cloud region that a serving target must be told.
    regional: bool = False
    #: The directory of the store when it is a POSIX tree on this machine, else None.
    local_root: Path | None = None
    #: A POSIX tree that every staging worker mounts (local disk, FSx): workers then share the
    #: quarantine beside it. Otherwise (S3) each worker keeps its own local quarantine.
    mounted_tree: bool = False

    def region(self) -> str | None:
        """The cloud region the store lives in, where it knows it."""
        return None

    def watch_transfers(self, progress: ProgressCallback | None) -> None:
        """Report bytes the store itself moves (uploads, copies) to ``progress``; a store
        that only places files it is handed has nothing to report."""
        return None

    # ---- writing -------------------------------------------------------------------------
    @abstractmethod
    def begin_revision(self, repo_id: str, commit: str) -> RevisionWriter:
        """A writer for one revision. Opening one has no side effect on other writers."""

    def clean_incomplete(self, repo_id: str, commit: str) -> int:
        """Drop what crashed runs of this revision left half-written (S3: multipart uploads);
        returns how many. Staging runs it once, at the start of a run that holds the revision,
        never while another writer of it may be putting files."""
        return 0

    @abstractmethod
    def add_to_revision(self, repo_id: str, commit: str, rel: str, data: bytes) -> None:
        """Create ``<revision>/<rel>`` once in a published revision, touching nothing else.

        For metadata that may come after publication (a signature in ``.k3a/``). Raises
        :class:`NotFound` if the revision is not published, :class:`AlreadyExists` if ``rel``
        is already there.
        """

    @abstractmethod
    def repair_file(self, repo_id: str, commit: str, record: FileRecord,
                    local_path: Path) -> None:
        """Put back a published file that failed verification, from ``local_path`` (bytes
        already checked against ``record``). Only that file of this revision changes: the
        manifest is untouched, so the revision keeps its digest (``k3a stage --repair``)."""

    @abstractmethod
    def delete_revision(self, repo_id: str, commit: str) -> int:
        """Remove a published revision (an admin action, e.g. retention). Returns the bytes
        freed: those whose last copy went with it (a file still linked or referenced from
        another revision stays, and is not counted)."""

    @abstractmethod
    def reclaimable_bytes(self, repo_id: str, commit: str) -> int:
        """What :meth:`delete_revision` would free now; writes nothing."""

    # ---- manifests -----------------------------------------------------------------------
    @abstractmethod
    def list_revisions(self, repo_id: str) -> list[str]:
        """Commits of ``repo_id`` that are published (their manifest exists)."""

    @abstractmethod
    def read_manifest(self, repo_id: str, commit: str) -> ShardManifest | None: ...

    @abstractmethod
    def read_provenance(self, repo_id: str, commit: str) -> Provenance | None:
        """Where the bytes of this store's copy came from (None for revisions published
        before provenance moved beside the manifest: theirs is inside it)."""

    @abstractmethod
    def published_manifest_bytes(self, repo_id: str, commit: str, *,
                                 hint: str | None = None) -> bytes:
        """The stored bytes of a revision's manifest; raises :class:`NotPublished`."""

    def published_manifest(self, repo_id: str, commit: str, *,
                           hint: str | None = None) -> ShardManifest:
        """A revision's manifest; raises :class:`NotPublished`."""
        return ShardManifest.parse(self.published_manifest_bytes(repo_id, commit, hint=hint),
                                   f"{self.location(repo_id, commit)}/{META_DIR}/{MANIFEST_NAME}")

    # ---- files ---------------------------------------------------------------------------
    @abstractmethod
    def object_sizes(self, prefix: str) -> dict[str, int]:
        """Every key under ``prefix`` with its size in bytes, from one listing (no reads).

        What the promotion gate uses to check a published revision cheaply; on S3 the
        ListObjectsV2 pages already carry each object's size.
        """

    @abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """A streaming reader of a stored object; raises :class:`NotFound`."""

    def local_path(self, key: str) -> Path | None:
        """The POSIX path of ``key`` when the store is a mounted tree, else None."""
        return None

    def object_records(self, repo_id: str, commit: str) -> dict[str, ObjectRecord]:
        """Where each file of a published revision lives, by path, as recorded when it was
        published; empty where the store keeps no such record (a file tree: a revision's
        files are the files under its directory)."""
        return {}

    def open_object(self, record: ObjectRecord) -> BinaryIO:
        """A streaming reader of the object ``record`` names; raises :class:`NotFound`."""
        return self.open_read(record.key)

    def open_file(self, repo_id: str, commit: str, path: str,
                  records: Mapping[str, ObjectRecord]) -> BinaryIO:
        """A streaming reader of file ``path`` of a revision: the object its ``records``
        (:meth:`object_records`) name, else the one under the revision's prefix."""
        record = records.get(path)
        if record is not None:
            return self.open_object(record)
        return self.open_read(f"{revision_prefix(repo_id, commit)}/{path}")

    def read_sizes(self, repo_id: str, commit: str) -> dict[str, int]:
        """Path -> size of every file a revision reads (its ``.k3a/`` aside): what lies under
        its prefix, and where its records name an object elsewhere, that object's size (None
        of it read). What the artifact gate compares with the manifest."""
        prefix = revision_prefix(repo_id, commit) + "/"
        return {
            key[len(prefix):]: size for key, size in self.object_sizes(prefix).items()
            if not key[len(prefix):].startswith(f"{META_DIR}/")
        }

    @abstractmethod
    def open_ranges(self, repo_id: str, commit: str, connections: int) -> RangeReader:
        """A ranged reader of a published revision's files, for ``connections`` threads."""

    # ---- where a server reads it ---------------------------------------------------------
    def materialize(self, repo_id: str, commit: str) -> int:
        """Make the revision's prefix hold every file it reads, for a server that reads the
        prefix itself (HyperPod's ``s3Storage``, an FSx import). Returns the bytes copied;
        a store whose revisions always hold their files copies none. Raises
        :class:`VerifyMismatch` when the prefix then does not serve the revision as recorded
        (:meth:`check_served`)."""
        self.refuse_unserved(repo_id, commit)
        return 0

    @abstractmethod
    def check_served(self, repo_id: str, commit: str,
                     manifest: ShardManifest) -> dict[str, str]:
        """What a server reading the revision's place by itself (HyperPod's ``s3Storage``, a
        mount, an FSx import) would get that is not the revision as published: path -> why,
        for each file whose bytes there are not provably the recorded ones; empty when the
        place serves exactly the revision. Cheap enough for a promotion gate: each store says
        what it checks and what it leaves to ``k3a verify``."""

    def refuse_unserved(self, repo_id: str, commit: str) -> None:
        """Raise :class:`VerifyMismatch` naming what :meth:`check_served` finds."""
        problems = self.check_served(repo_id, commit, self.published_manifest(repo_id, commit))
        if problems:
            listed = "; ".join(f"{path}: {why}" for path, why in sorted(problems.items())[:5])
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise VerifyMismatch(
                f"{self.location(repo_id, commit)} does not serve {repo_id}@{commit} as "
                f"published: {listed}{more}")

    def placement(self, repo_id: str, commit: str) -> Placement:
        """Where a server reads this revision from."""
        return type(self).placement_at(self.url, revision_prefix(repo_id, commit))

    @classmethod
    @abstractmethod
    def placement_at(cls, store_url: str, revision_path: str) -> Placement:
        """The placement of ``revision_path`` in the store at ``store_url``, from the URL
        alone (a render has a tuple's weights location, not a connection to the store)."""

    def location(self, repo_id: str, commit: str) -> str:
        """Where a server reads this revision from: a path or an ``s3://`` URL."""
        return f"{self.url.rstrip('/')}/{revision_prefix(repo_id, commit)}"
