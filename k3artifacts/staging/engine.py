"""Staging: a Hub revision becomes a verified, published revision in a store.

    resolve commit -> list -> listing rules -> plan (what is verified already, what the store
    holds) -> per-file jobs through a runner: download to quarantine, hashing as bytes arrive,
    check (size, upstream sha256 / git oid, safetensors header), hand to the store
    -> index check -> license + remote-code capture -> manifest -> publish (manifest last)

This is the one staging loop: ``k3a stage`` runs it with a :class:`ThreadRunner`, the
``stage-release`` flow with a runner of Prefect tasks. The per-file work is
:mod:`k3artifacts.staging.worker`; where it runs is the runner's business.

Every byte is read from the network once and from disk at most once more (the safetensors
header, a few KB). A re-run of an interrupted staging resumes partial files and skips verified
ones. Nothing is published unless every file passed.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts.errors import K3AError, Refusal, ReleaseRefused, VerifyMismatch
from k3artifacts.revisions.manifest import FileRecord, RemoteCodeEntry, ShardManifest
from k3artifacts.revisions.refs import COMMIT, check_repo_id
from k3artifacts.staging import license as license_capture
from k3artifacts.staging.events import StageObserver
from k3artifacts.staging.hub import HubSource, RemoteFile
from k3artifacts.staging.quarantine import Quarantine, VerifiedEntry
from k3artifacts.staging.rules import listing_refusals
from k3artifacts.staging.runners import Runner, ThreadRunner
from k3artifacts.staging.safetensors_header import check_index
from k3artifacts.staging.worker import (
    FileJob,
    FileOutcome,
    RunContext,
    RunSpec,
    StageOptions,
    matches_listing,
    register,
    unregister,
)
from k3artifacts.stores.base import PutReceipt, Store, receipt_stats

__all__ = ["StageOptions", "StageResult", "stage"]

_COPY_BLOCK = 1 << 20


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


class _Tally(StageObserver):
    """Passes events on, counting the bytes each file reported, so that a file fetched in
    another process (whose byte events never reach here) still advances every display by its
    size when its outcome arrives."""

    def __init__(self, inner: StageObserver):
        self.inner = inner
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def planned(self, files: list[RemoteFile], reused: set[str]) -> None:
        self.inner.planned(files, reused)

    def file_started(self, path: str, size: int) -> None:
        self.inner.file_started(path, size)

    def advance(self, path: str, nbytes: int) -> None:
        with self._lock:
            self._seen[path] = self._seen.get(path, 0) + nbytes
        self.inner.advance(path, nbytes)

    def finished(self, record: FileRecord) -> None:
        with self._lock:
            missing = record.size - min(self._seen.pop(record.path, 0), record.size)
        if missing:
            self.inner.advance(record.path, missing)
        self.inner.file_done(record, reused=False)

    def file_done(self, record: FileRecord, reused: bool) -> None:
        self.inner.file_done(record, reused)

    def file_failed(self, path: str, error: BaseException) -> None:
        self.inner.file_failed(path, error)

    def note(self, message: str) -> None:
        self.inner.note(message)


def stage(
    source: HubSource,
    store: Store,
    repo_id: str,
    revision: str,
    quarantine_root: Path,
    options: StageOptions | None = None,
    observer: StageObserver | None = None,
    runner: Runner | None = None,
) -> StageResult:
    """Stage ``repo_id@revision`` into ``store``; see the module docstring. ``runner`` runs
    the per-file jobs (default: a thread pool of ``options.workers``)."""
    started = time.monotonic()
    options = options or StageOptions()
    observer = observer or StageObserver()
    check_repo_id(repo_id)
    commit = source.resolve(repo_id, revision)
    if commit != revision:
        observer.note(f"resolved {repo_id}@{revision} to commit {commit}")

    with Quarantine(quarantine_root, repo_id, commit) as quarantine:
        existing = store.read_manifest(repo_id, commit)
        if existing is not None:
            observer.note(f"{repo_id}@{commit} is already published in {store.url}; nothing to do")
            return StageResult.of(existing, store, started, already=True)
        result = _Run(source, store, repo_id, commit, quarantine, options, observer).execute(
            runner or ThreadRunner(options.workers), started
        )
    if not options.keep_quarantine:
        quarantine.remove()
    return result


class _Run:
    """One staging run, coordinated by this process (which holds the quarantine lock)."""

    def __init__(
        self,
        source: HubSource,
        store: Store,
        repo_id: str,
        commit: str,
        quarantine: Quarantine,
        options: StageOptions,
        observer: StageObserver,
    ):
        if not COMMIT.match(commit):
            raise ValueError(f"commit must be 40 hex, got {commit!r}")
        self.repo_id = repo_id
        self.commit = commit
        self.store = store
        self.quarantine = quarantine
        self.options = options
        self.tally = _Tally(observer)
        spec = RunSpec(
            run_id=uuid.uuid4().hex,
            endpoint=source.endpoint,
            store_url=store.url,
            repo_id=repo_id,
            commit=commit,
            quarantine_root=str(_root_of(quarantine)) if store.mounted_tree else None,
            options=options,
        )
        # The one writer of this process: jobs running here in threads share it.
        self.ctx = RunContext(
            spec, source, store, store.begin_revision(repo_id, commit), quarantine, self.tally,
            drop_when_stored=False,
        )

    def execute(self, runner: Runner, started: float) -> StageResult:
        # Debris of crashed runs (S3 multipart uploads) goes first, while this process holds
        # the revision and before any job of this run starts an upload of its own.
        self.store.clean_incomplete(self.repo_id, self.commit)
        register(self.ctx)
        try:
            files, reusable, receipts = self._plan()
            entries = [self._reuse(reusable[f.path], receipts) for f in files if f.path in reusable]
            todo = sorted((f for f in files if f.path not in reusable), key=lambda f: -f.size)
            downloaded = self._fetch(runner, todo, entries, receipts)
            try:
                manifest = self._build_manifest(entries)
            except ReleaseRefused:
                self.ctx.writer.abort()
                raise
            with self.ctx.in_store(f"{self.repo_id}@{self.commit}"):
                self.ctx.writer.commit(manifest)
        finally:
            unregister(self.ctx)
        # A job of this run killed mid-upload on another machine (and retried elsewhere) may
        # have left a multipart upload; the revision is sealed now, so none is still wanted.
        self.store.clean_incomplete(self.repo_id, self.commit)
        result = StageResult.of(manifest, self.store, started, already=False)
        result.downloaded_bytes = downloaded
        result.reused_files = len(reusable)
        result.store_stats = receipt_stats(receipts)
        return result

    def _plan(
        self,
    ) -> tuple[list[RemoteFile], dict[str, VerifiedEntry], list[PutReceipt | None]]:
        """List the revision, apply the listing rules, and find what needs no download."""
        files = self.ctx.source.list_files(self.repo_id, self.commit)
        refusals = listing_refusals(
            ((f.path, f.entry_type) for f in files), allow_pickle=self.options.allow_pickle
        )
        if refusals:
            raise ReleaseRefused(refusals)
        verified = self.quarantine.verified()
        reusable: dict[str, VerifiedEntry] = {}
        receipts: list[PutReceipt | None] = []
        for f in files:
            entry = verified.get(f.path)
            if entry is None or not matches_listing(entry.record, f):
                continue
            if entry.stored:
                # Handed to the store and dropped locally by an earlier run: reusable only if
                # the store-side revision still holds it; otherwise downloaded again.
                adopted = self.ctx.writer.adopt(entry.record)
                if adopted is None:
                    continue
                receipts.append(adopted)
            reusable[f.path] = entry
        self.tally.planned(files, set(reusable))
        return files, reusable, receipts

    def _reuse(self, entry: VerifiedEntry, receipts: list[PutReceipt | None]) -> VerifiedEntry:
        receipts.append(self.ctx.store_entry(entry))
        self.tally.file_done(entry.record, reused=True)
        return entry

    def _fetch(
        self,
        runner: Runner,
        todo: list[RemoteFile],
        entries: list[VerifiedEntry],
        receipts: list[PutReceipt | None],
    ) -> int:
        """Run a job per file; collect what verified, stop starting new jobs at the first
        failure (running ones finish, so their partial files stay resumable)."""
        downloaded = 0
        refusals: list[Refusal] = []
        errors: list[tuple[str, BaseException]] = []
        jobs = [FileJob(self.ctx.spec, remote) for remote in todo]
        for job, outcome in runner.run(jobs):
            if isinstance(outcome, FileOutcome):
                entries.append(outcome.entry)
                receipts.append(outcome.receipt)
                downloaded += outcome.downloaded
                self.tally.finished(outcome.entry.record)
                continue
            self.tally.file_failed(job.remote.path, outcome)
            # Wrong bytes at a pinned commit will not become right, and anything else
            # (network gone, disk full) stops the run too.
            runner.stop()
            if isinstance(outcome, Refusal):
                refusals.append(outcome)
            else:
                errors.append((job.remote.path, outcome))
        if refusals:
            self.ctx.writer.abort()
            raise ReleaseRefused(sorted(refusals, key=lambda r: r.path))
        if errors:
            raise _one_failure(errors)
        return downloaded

    def _local(self, record: FileRecord) -> Path:
        """A manifest input in this process's quarantine; read back from the store (checked
        against its record) when a worker without a shared disk fetched it."""
        path = self.quarantine.final_path(record.path)
        try:
            if path.stat().st_size == record.size:
                return path
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.readback")
        sha = hashlib.sha256()
        with self.ctx.writer.open_staged(record.path) as src, open(tmp, "wb") as dst:
            while block := src.read(_COPY_BLOCK):
                sha.update(block)
                dst.write(block)
        if sha.hexdigest() != record.sha256:
            tmp.unlink(missing_ok=True)
            raise VerifyMismatch(
                f"{record.path}: the copy in the store's unpublished revision hashes to "
                f"{sha.hexdigest()}, verified as {record.sha256}",
                hint="nothing was published; re-run to fetch it again",
            )
        os.replace(tmp, path)
        return path

    def _build_manifest(self, entries: list[VerifiedEntry]) -> ShardManifest:
        """Index check, license and remote-code capture; raise ReleaseRefused on index errors."""
        entries = sorted(entries, key=lambda e: e.record.path)
        present = {e.record.path for e in entries}
        tensors = {
            e.record.path: frozenset(e.tensors) for e in entries if e.tensors is not None
        }
        refusals: list[Refusal] = []
        for e in entries:
            if e.record.kind == "index" and e.record.path.endswith(".safetensors.index.json"):
                refusals += check_index(e.record.path, self._local(e.record), present, tensors)
        if refusals:
            raise ReleaseRefused(refusals)
        license_entry = next((e for e in entries if e.record.kind == "license"), None)
        card_entry = next((e for e in entries if e.record.kind == "card"), None)
        lic = license_capture.capture(
            license_entry.record.path if license_entry else None,
            self._local(license_entry.record) if license_entry else None,
            self._local(card_entry.record) if card_entry else None,
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


def _root_of(quarantine: Quarantine) -> Path:
    """The root a :class:`Quarantine` was made from (its directory is ``root/org--name/commit``)."""
    return quarantine.dir.parent.parent


def _one_failure(errors: list[tuple[str, BaseException]]) -> BaseException:
    """What to raise for the files that could not be fetched: a bug as itself; else the first
    failure (its message and advice are the most precise: a full disk, an unreachable host),
    naming the other files that failed with it."""
    for _, exc in errors:
        if not isinstance(exc, K3AError):
            return exc
    first = errors[0][1]
    others = [f"{path}: {str(exc).splitlines()[0]}" for path, exc in errors[1:]]
    if others:
        first.args = (f"{first}\n  also failed ({len(others)}):\n    " + "\n    ".join(others),)
    return first
