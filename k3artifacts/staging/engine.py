"""Staging: a Hub revision becomes a verified, published revision in a store.

    resolve commit -> list -> listing rules -> download to quarantine, hashing as bytes arrive
    -> per-file checks (size, upstream sha256 / git oid, safetensors header) -> index check
    -> license + remote-code capture -> manifest -> publish (manifest last, atomically)

Every byte is read from the network once and from disk at most once more (the safetensors
header, a few KB). A re-run of an interrupted staging resumes partial files and skips
verified ones. Nothing is published unless every file passed.

:class:`Stager` exposes the steps one at a time so an orchestrator (the Prefect flow) can run
one task per file; :func:`stage` runs them all with a thread pool.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts import faultpoints
from k3artifacts.config import default_workers
from k3artifacts.errors import Refusal, ReleaseRefused, Unavailable
from k3artifacts.revisions.hashing import MultiHasher
from k3artifacts.revisions.manifest import FileRecord, RemoteCodeEntry, ShardManifest
from k3artifacts.revisions.refs import COMMIT, check_repo_id
from k3artifacts.staging import license as license_capture
from k3artifacts.staging.download import PermanentError, RetryPolicy, fetch
from k3artifacts.staging.events import StageObserver
from k3artifacts.staging.hub import HubSource, RemoteFile
from k3artifacts.staging.quarantine import Quarantine, VerifiedEntry
from k3artifacts.staging.rules import file_kind, listing_refusals
from k3artifacts.staging.safetensors_header import check_header, check_index
from k3artifacts.stores.base import SMALL_FILE, RevisionWriter, Store


@dataclass(frozen=True)
class StageOptions:
    allow_pickle: bool = False
    workers: int = field(default_factory=default_workers)
    retry: RetryPolicy = RetryPolicy()
    #: Keep the quarantine copy after publishing (default: remove it, it is in the store now).
    keep_quarantine: bool = False
    #: Bound on local quarantine disk: weights in flight plus verified-but-not-yet-stored stay
    #: under this many bytes, and a shard's local copy is deleted once the store has it. For a
    #: checkpoint larger than the staging worker's disk (S3, or an FSx mount off local NVMe).
    window_bytes: int | None = None


@dataclass
class StageResult:
    repo_id: str
    commit: str
    manifest_digest: str
    location: str
    files: int
    total_bytes: int
    downloaded_bytes: int = 0
    reused_files: int = 0
    already_published: bool = False
    seconds: float = 0.0
    remote_code: list[str] = field(default_factory=list)
    license_sha256: str | None = None
    #: What the store moved for this revision (S3: bytes uploaded / copied server-side...).
    store_stats: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls, manifest: ShardManifest, store: Store, started: float, *, already: bool
    ) -> StageResult:
        """The result of staging ``manifest`` into ``store``, timed from ``started``."""
        return cls(
            repo_id=manifest.repo_id,
            commit=manifest.commit,
            manifest_digest=manifest.digest(),
            location=store.location(manifest.repo_id, manifest.commit),
            files=len(manifest.files),
            total_bytes=manifest.total_bytes,
            already_published=already,
            seconds=time.monotonic() - started,
            remote_code=[c.path for c in manifest.remote_code],
            license_sha256=manifest.license.sha256,
        )


class Stager:
    def __init__(
        self,
        source: HubSource,
        store: Store,
        repo_id: str,
        commit: str,
        quarantine: Quarantine,
        options: StageOptions = StageOptions(),
        observer: StageObserver | None = None,
    ):
        self.source = source
        self.store = store
        self.repo_id = check_repo_id(repo_id)
        if not COMMIT.match(commit):
            raise ValueError(f"commit must be 40 hex, got {commit!r}")
        self.commit = commit
        self.quarantine = quarantine
        self.options = options
        self.observer = observer or StageObserver()
        self._headers = source.headers()
        self._want_crc = "crc64nvme" in store.wanted_checksums
        self.writer: RevisionWriter | None = None
        self._downloaded = 0
        self._count_lock = threading.Lock()

    def plan(self) -> tuple[list[RemoteFile], dict[str, VerifiedEntry]]:
        """List the revision and apply the listing rules; return files and reusable entries."""
        files = self.source.list_files(self.repo_id, self.commit)
        refusals = listing_refusals(
            ((f.path, f.entry_type) for f in files), allow_pickle=self.options.allow_pickle
        )
        if refusals:
            raise ReleaseRefused(refusals)
        verified = self.quarantine.verified()
        reusable = {}
        for f in files:
            entry = verified.get(f.path)
            if entry is None or not _matches_listing(entry.record, f):
                continue
            # A shard already handed to the store and dropped locally is reusable only if the
            # store-side revision still holds it; otherwise it is downloaded again.
            if entry.stored and not (self.writer is not None and self.writer.adopt(entry.record)):
                continue
            reusable[f.path] = entry
        self.observer.planned(files, set(reusable))
        return files, reusable

    def fetch_file(self, remote: RemoteFile) -> VerifiedEntry:
        """Download, hash and check one file into quarantine; raise Refusal if it is wrong."""
        part = self.quarantine.part_path(remote.path)
        self.observer.file_started(remote.path, remote.size)
        if not remote.lfs_sha256 and not remote.git_oid:
            raise Refusal(remote.path, "unverifiable", "the hub lists no sha256 or git blob id")
        git_size = remote.size if remote.git_oid else None

        def counted(n: int) -> None:
            with self._count_lock:
                self._downloaded += n
            self.observer.advance(remote.path, n)

        with self._in_quarantine(remote.path):
            try:
                hasher = fetch(
                    self.source.file_url(self.repo_id, self.commit, remote.path),
                    self._headers,
                    part,
                    remote.size,
                    lambda: MultiHasher(git_blob_size=git_size, crc64nvme=self._want_crc),
                    policy=self.options.retry,
                    on_bytes=counted,
                    on_resumed=lambda n: self.observer.advance(remote.path, n),
                    label=remote.path,
                    durable=remote.size >= SMALL_FILE,
                )
            except PermanentError as exc:
                raise Refusal(remote.path, "download", str(exc)) from None
            faultpoints.pause("downloaded", remote.path)
            try:
                record, tensors = self._check(remote, part, hasher)
            except Refusal:
                # Wrong bytes are not worth resuming from: the next attempt starts clean.
                self.quarantine.discard(part)
                raise
            entry = self.quarantine.accept(
            record, part, tensors, hasher.extra_checksums(), durable=remote.size >= SMALL_FILE
        )
        self._store(entry)
        self.observer.file_done(record, reused=False)
        return entry

    def open_writer(self) -> None:
        """Start the store-side revision; files are handed to it as soon as they verify, so
        uploads overlap downloads. Nothing is visible to readers until :meth:`publish`."""
        self.writer = self.store.begin_revision(self.repo_id, self.commit)

    def _store(self, entry: VerifiedEntry) -> None:
        # A stored entry was adopted by the writer in plan(); there is nothing left to hand over.
        if self.writer is None or entry.stored:
            return
        record = entry.record
        with self._in_store(record.path):
            self.writer.put_file(
                record, self.quarantine.final_path(record.path), checksums=entry.checksums
            )
        if self.options.window_bytes is not None and record.kind == "weights":
            # Only weights leave quarantine early: small files (index, license, card) are
            # read again when the manifest is built.
            with self._in_quarantine(record.path):
                self.quarantine.mark_stored(entry)

    # A full or failing disk is no reason for a traceback: the operator needs to know which
    # side (local quarantine or the store), which file, and that a re-run resumes.
    @contextlib.contextmanager
    def _in_quarantine(self, path: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise Unavailable(
                f"{path}: writing to quarantine {self.quarantine.dir}: {exc.strerror or exc}",
                hint="free space there or point --quarantine (K3A_QUARANTINE) at a larger disk, "
                "then re-run: partial and verified files are kept and resumed",
            ) from None

    @contextlib.contextmanager
    def _in_store(self, path: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise Unavailable(
                f"{path}: writing to store {self.store.url}: {exc.strerror or exc}",
                hint="free space in the store (or fix its permissions), then re-run: "
                "files verified in quarantine are reused, nothing was published",
            ) from None

    def _check(
        self, remote: RemoteFile, part: Path, hasher: MultiHasher
    ) -> tuple[FileRecord, frozenset[str] | None]:
        digests = hasher.hexdigests()
        if digests.size != remote.size:
            raise Refusal(
                remote.path, "size", f"received {digests.size} bytes, listing says {remote.size}"
            )
        if remote.lfs_sha256 and digests.sha256 != remote.lfs_sha256:
            raise Refusal(
                remote.path,
                "sha256",
                f"received bytes hash to {digests.sha256}, upstream LFS sha256 is "
                f"{remote.lfs_sha256} (corrupted in transit or changed upstream)",
            )
        git_oid = hasher.git_oid()
        if git_oid is not None and git_oid != remote.git_oid:
            raise Refusal(
                remote.path,
                "git-oid",
                f"received bytes have git blob id {git_oid}, upstream lists {remote.git_oid}",
            )
        kind = file_kind(remote.path)
        summary = tensors = None
        if kind == "weights":
            info = check_header(remote.path, part, remote.size)
            summary, tensors = info.summary, info.tensor_names
        record = FileRecord(
            path=remote.path,
            size=remote.size,
            kind=kind,
            sha256=digests.sha256,
            xxh3_128=digests.xxh3_128,
            upstream_sha256=remote.lfs_sha256,
            upstream_git_oid=remote.git_oid,
            safetensors=summary,
        )
        return record, tensors

    def reuse(self, entry: VerifiedEntry) -> VerifiedEntry:
        self._store(entry)
        self.observer.file_done(entry.record, reused=True)
        return entry

    def build_manifest(self, entries: Iterable[VerifiedEntry]) -> ShardManifest:
        """Index check, license and remote-code capture; raise ReleaseRefused on index errors."""
        entries = sorted(entries, key=lambda e: e.record.path)
        present = {e.record.path for e in entries}
        tensors = {
            e.record.path: frozenset(e.tensors) for e in entries if e.tensors is not None
        }
        refusals: list[Refusal] = []
        for e in entries:
            if e.record.kind == "index" and e.record.path.endswith(".safetensors.index.json"):
                refusals += check_index(
                    e.record.path, self.quarantine.final_path(e.record.path), present, tensors
                )
        if refusals:
            raise ReleaseRefused(refusals)
        license_entry = next((e for e in entries if e.record.kind == "license"), None)
        card_entry = next((e for e in entries if e.record.kind == "card"), None)
        lic = license_capture.capture(
            license_entry.record.path if license_entry else None,
            self.quarantine.final_path(license_entry.record.path) if license_entry else None,
            self.quarantine.final_path(card_entry.record.path) if card_entry else None,
        )
        return ShardManifest(
            repo_id=self.repo_id,
            commit=self.commit,
            files=[e.record for e in entries],
            license=lic,
            remote_code=[
                RemoteCodeEntry(path=e.record.path, sha256=e.record.sha256)
                for e in entries
                if e.record.kind == "code"
            ],
            total_bytes=sum(e.record.size for e in entries),
        )

    def publish(self, manifest: ShardManifest) -> None:
        """Make the revision visible, manifest last."""
        with self._in_store(f"{self.repo_id}@{self.commit}"):
            self.writer.commit(manifest)

    def abandon(self) -> None:
        """The revision was refused: drop what the store-side revision holds."""
        if self.writer is not None:
            self.writer.abort()

    @property
    def downloaded_bytes(self) -> int:
        return self._downloaded


def _matches_listing(record: FileRecord, remote: RemoteFile) -> bool:
    return (
        record.size == remote.size
        and record.upstream_sha256 == remote.lfs_sha256
        and record.upstream_git_oid == remote.git_oid
    )


def stage(
    source: HubSource,
    store: Store,
    repo_id: str,
    revision: str,
    quarantine_root: Path,
    options: StageOptions = StageOptions(),
    observer: StageObserver | None = None,
) -> StageResult:
    """Stage ``repo_id@revision`` into ``store``; see the module docstring."""
    started = time.monotonic()
    observer = observer or StageObserver()
    check_repo_id(repo_id)
    commit = source.resolve(repo_id, revision)
    if commit != revision:
        observer.note(f"resolved {repo_id}@{revision} to commit {commit}")

    with Quarantine(quarantine_root, repo_id, commit) as quarantine:
        stager = Stager(source, store, repo_id, commit, quarantine, options, observer)
        existing = store.read_manifest(repo_id, commit)
        if existing is not None:
            observer.note(f"{repo_id}@{commit} is already published in {store.url}; nothing to do")
            return StageResult.of(existing, store, started, already=True)

        stager.open_writer()
        files, reusable = stager.plan()
        todo = [f for f in files if f.path not in reusable]
        # Large files first: the tail of the run is then many small files spread over workers.
        todo.sort(key=lambda f: -f.size)
        try:
            entries = [stager.reuse(reusable[f.path]) for f in files if f.path in reusable]
            entries += _fetch_all(stager, todo, options)
            manifest = stager.build_manifest(entries)
        except ReleaseRefused:
            stager.abandon()
            raise
        stager.publish(manifest)
        result = StageResult.of(manifest, store, started, already=False)
        result.downloaded_bytes = stager.downloaded_bytes
        result.reused_files = len(reusable)
        result.store_stats = stager.writer.stats()
    if not options.keep_quarantine:
        quarantine.remove()
    return result


class _ByteBudget:
    """Admits files while the bytes they hold locally stay under a window."""

    def __init__(self, window: int | None):
        self.window = window
        self.used = 0
        self._cond = threading.Condition()

    def acquire(self, size: int) -> None:
        if self.window is None:
            return
        with self._cond:
            # A file bigger than the window runs alone rather than never.
            self._cond.wait_for(lambda: self.used == 0 or self.used + size <= self.window)
            self.used += size

    def release(self, size: int) -> None:
        if self.window is None:
            return
        with self._cond:
            self.used -= size
            self._cond.notify_all()


def _fetch_all(
    stager: Stager, todo: list[RemoteFile], options: StageOptions
) -> list[VerifiedEntry]:
    budget = _ByteBudget(options.window_bytes)

    def one(remote: RemoteFile) -> VerifiedEntry:
        counted = remote.size if file_kind(remote.path) == "weights" else 0
        budget.acquire(counted)
        try:
            return stager.fetch_file(remote)
        finally:
            budget.release(counted)

    entries: list[VerifiedEntry] = []
    refusals: list[Refusal] = []
    with ThreadPoolExecutor(max(1, options.workers), thread_name_prefix="k3a-fetch") as pool:
        futures = [pool.submit(one, f) for f in todo]
        for fut in as_completed(futures):
            if fut.cancelled():
                continue
            exc = fut.exception()
            if exc is None:
                entries.append(fut.result())
                continue
            # Wrong bytes at a pinned commit will not become right, and anything else
            # (network gone, disk full) stops the run: start nothing new, let running
            # downloads finish so their partial files stay resumable.
            for other in futures:
                other.cancel()
            if not isinstance(exc, Refusal):
                raise exc
            refusals.append(exc)
    if refusals:
        raise ReleaseRefused(sorted(refusals, key=lambda r: r.path))
    return entries
