"""Staging: a Hub revision becomes a verified, published revision in a store.

    resolve commit -> list -> listing rules -> plan (:mod:`.plan`: present in quarantine,
    reused from a published revision, or downloaded) -> reuse inside the store (a failed check
    turns the file into a download) -> per-file jobs through a runner: download to quarantine,
    hashing as bytes arrive, check (size, upstream sha256 / git oid, safetensors header), hand to
    the store -> index check -> license + remote-code capture -> manifest -> publish (manifest
    last)

This is the one staging loop: ``k3a stage`` runs it with a :class:`ThreadRunner`, the
``stage-release`` flow with a runner of Prefect tasks. The per-file work is
:mod:`k3artifacts.staging.worker`; where it runs is the runner's business.

Every byte is read from the network once and from disk at most once more (the safetensors
header of a reused file, a few KB read by range). A re-run of an interrupted staging resumes
partial files and skips verified ones. Nothing is published unless every file passed.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from k3artifacts import faultpoints
from k3artifacts.errors import AlreadyExists, K3AError, Refusal, ReleaseRefused, VerifyMismatch
from k3artifacts.revisions.manifest import FileRecord, RemoteCodeEntry, ShardManifest
from k3artifacts.revisions.refs import COMMIT, check_repo_id
from k3artifacts.signing.keys import ReleaseSigner
from k3artifacts.signing.revision import sign_revision
from k3artifacts.staging import license as license_capture
from k3artifacts.staging.events import StageObserver
from k3artifacts.staging.hub import HubSource, RemoteFile
from k3artifacts.staging.plan import (
    ContentIndex,
    PlannedFile,
    StagePlan,
    plan_files,
    reused_record,
)
from k3artifacts.staging.quarantine import Quarantine, VerifiedEntry
from k3artifacts.staging.rules import listing_refusals
from k3artifacts.staging.runners import Runner, ThreadRunner
from k3artifacts.staging.safetensors_header import check_header_at, check_index
from k3artifacts.staging.worker import (
    FileJob,
    FileOutcome,
    RunContext,
    RunSpec,
    StageOptions,
    register,
    unregister,
)
from k3artifacts.stores.base import PutReceipt, ReuseFailed, Store, receipt_stats
from k3artifacts.stores.revisions import RevisionStore
from k3artifacts.trust.keys import release_signer

__all__ = ["StageOptions", "StageResult", "act_stage", "plan_stage", "stage"]

_COPY_BLOCK = 1 << 20
#: Reuses in flight. A reuse is a few small requests to the store (a server-side reference
#: or copy, a header read back): latency, not CPU, so its pool does not follow the download
#: workers, which are one per core (2 on a 2-core machine: a one-shard commit then waited on
#: 15 unchanged files' reuses, two at a time, after its shard had arrived).
REUSE_THREADS = 16


@dataclass
class StageResult:
    repo_id: str
    commit: str
    manifest_digest: str
    location: str
    files: int
    total_bytes: int
    #: Bytes pulled from the Hub by this run.
    downloaded_bytes: int = 0
    #: Files this run did not download: already present, or reused from published revisions.
    reused_files: int = 0
    #: Bytes copied inside the store from published revisions of the repo.
    reused_bytes: int = 0
    #: Files planned for reuse whose copy failed its check (or whose source vanished): each
    #: was downloaded instead, and is named here with the reason.
    reuse_fallbacks: list[str] = field(default_factory=list)
    #: The plan as run: files and bytes per action (download, reuse, present).
    plan: dict[str, dict[str, int]] = field(default_factory=dict)
    already_published: bool = False
    seconds: float = 0.0
    remote_code: list[str] = field(default_factory=list)
    license_sha256: str | None = None
    #: What the store moved for this revision (S3: bytes uploaded / copied server-side...).
    store_stats: dict[str, int] = field(default_factory=dict)
    #: Store key of the revision's signature when staging signed it (``--signing-key``).
    signature: str | None = None

    @classmethod
    def of(
        cls, manifest: ShardManifest, store: RevisionStore, started: float, *, already: bool
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

    def planned(
        self, files: list[RemoteFile], reused: set[str], plan: StagePlan | None = None
    ) -> None:
        self.inner.planned(files, reused, plan)

    def file_started(self, path: str, size: int) -> None:
        self.inner.file_started(path, size)

    def file_resumed(self, path: str, offset: int) -> None:
        self.inner.file_resumed(path, offset)

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
    """The staging move: :func:`plan_stage`, then :func:`act_stage`; see the module docstring.
    ``runner`` runs the per-file jobs (default: a thread pool of ``options.workers``)."""
    started = time.monotonic()
    plan = plan_stage(source, store, repo_id, revision, quarantine_root, options)
    if plan.commit != revision and observer is not None:
        observer.note(f"resolved {repo_id}@{revision} to commit {plan.commit}")
    return act_stage(source, store, plan, quarantine_root, options, observer, runner,
                     started=started)


def act_stage(
    source: HubSource,
    store: Store,
    plan: StagePlan,
    quarantine_root: Path,
    options: StageOptions | None = None,
    observer: StageObserver | None = None,
    runner: Runner | None = None,
    *,
    started: float | None = None,
) -> StageResult:
    """Carry out ``plan`` (from :func:`plan_stage`): under the revision's quarantine lock,
    present files are checked again (the store-side ones still stored), the planned reuses and
    downloads run, and the revision is published. ``started``: the ``time.monotonic()`` the
    result is timed from (default: now)."""
    started = time.monotonic() if started is None else started
    options = options or StageOptions()
    observer = observer or StageObserver()
    repo_id, commit = plan.repo_id, plan.commit
    signer = release_signer(options.signing_key) if options.signing_key else None
    with Quarantine(quarantine_root, repo_id, commit) as quarantine:
        existing = store.read_manifest(repo_id, commit)
        if existing is not None:
            observer.note(f"{repo_id}@{commit} is already published in {store.url}; nothing to do")
            result = StageResult.of(existing, store, started, already=True)
            if signer is not None:
                result.signature = _sign(store, repo_id, commit, signer, observer)
            return result
        result = _Run(source, store, repo_id, commit, quarantine, options, observer).execute(
            runner or ThreadRunner(options.workers), started, plan
        )
    if signer is not None:
        result.signature = _sign(store, repo_id, commit, signer, observer)
    if not options.keep_quarantine:
        quarantine.remove()
    return result


def _sign(
    store: Store, repo_id: str, commit: str, signer: ReleaseSigner, observer: StageObserver
) -> str:
    """Sign the published revision from its manifest's digests (no byte is read again)."""
    try:
        signed = sign_revision(store, repo_id, commit, signer)
    except AlreadyExists as exc:
        # Published and signed earlier by another key: that signature stands (create-once).
        observer.note(f"{exc.key} exists, signed by another key; left as it is")
        return exc.key
    observer.note(f"signed {repo_id}@{commit}: {signed.key}")
    return signed.key


def plan_stage(
    source: HubSource,
    store: RevisionStore,
    repo_id: str,
    revision: str,
    quarantine_root: Path,
    options: StageOptions | None = None,
) -> StagePlan:
    """What :func:`stage` would move for ``repo_id@revision``, changing nothing: no lock, no
    writer, no download. The signing key is loaded (a bad key is refused before a byte is
    downloaded, not after 1.56 TB), the revision resolved to a commit and its listing checked
    against the listing rules (a refused file refuses the revision, ReleaseRefused exit 3).
    Files an earlier run handed to the store count as present; the run checks they still
    are. ``k3a stage --plan`` is this plan."""
    options = options or StageOptions()
    check_repo_id(repo_id)
    if options.signing_key:
        release_signer(options.signing_key)
    commit = source.resolve(repo_id, revision)
    published = store.read_manifest(repo_id, commit)
    if published is not None:
        return StagePlan(repo_id=repo_id, commit=commit, already_published=True, files=[
            PlannedFile(path=r.path, size=r.size, action="present") for r in published.files
        ])
    files = _listing(source, repo_id, commit, options)
    return plan_files(
        repo_id, commit, files, Quarantine(quarantine_root, repo_id, commit).verified(),
        ContentIndex.of_store(store, repo_id, exclude_commit=commit),
    )


def _listing(
    source: HubSource, repo_id: str, commit: str, options: StageOptions
) -> list[RemoteFile]:
    """The revision's files, refused as a whole if any breaks a listing rule."""
    files = source.list_files(repo_id, commit)
    refusals = listing_refusals(
        ((f.path, f.entry_type) for f in files), allow_pickle=options.allow_pickle
    )
    if refusals:
        raise ReleaseRefused(refusals)
    return files


class _Run:
    """One staging run, coordinated by this process (which holds the quarantine lock)."""

    def __init__(
        self,
        source: HubSource,
        store: RevisionStore,
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
        #: Why each file planned for reuse was downloaded instead.
        self.fallback_reasons: list[str] = []
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

    def execute(self, runner: Runner, started: float, planned: StagePlan) -> StageResult:
        # Debris of crashed runs (S3 multipart uploads) goes first, while this process holds
        # the revision and before any job of this run starts an upload of its own.
        self.store.clean_incomplete(self.repo_id, self.commit)
        register(self.ctx)
        try:
            files = planned.listing
            verified = self.quarantine.verified()
            plan, receipts = self._plan(planned, verified)
            by_path = {f.path: f for f in files}
            entries = [self._present(verified[p.path], receipts) for p in plan.of("present")]
            todo = sorted((by_path[p.path] for p in plan.of("download")), key=lambda f: -f.size)
            reused, fallbacks, downloaded = self._reuse_while_fetching(
                runner, plan.of("reuse"), by_path, todo, entries, receipts)
            if fallbacks:
                downloaded += self._fetch(runner, fallbacks, entries, receipts)
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
        # What readers see: ours, or an equal one a racing run of this revision published.
        published = self.store.read_manifest(self.repo_id, self.commit) or manifest
        result = StageResult.of(published, self.store, started, already=False)
        result.downloaded_bytes = downloaded
        result.reused_files = len(files) - len(todo)
        result.reused_bytes = reused
        result.reuse_fallbacks = self.fallback_reasons
        result.plan = plan.summary()
        result.store_stats = receipt_stats(receipts)
        return result

    def _plan(
        self, planned: StagePlan, verified: dict[str, VerifiedEntry]
    ) -> tuple[StagePlan, list[PutReceipt | None]]:
        """The plan again under the lock, from ``planned``'s listing and the published
        revisions it looked reuses up in: verified in quarantine (and, if handed to the store,
        still stored there), or held by a published revision of the repo (see :mod:`.plan`)."""
        files = planned.listing
        receipts: list[PutReceipt | None] = []

        def still_stored(record: FileRecord) -> bool:
            # Handed to the store and dropped locally by an earlier run: present only if the
            # store-side revision still holds it; otherwise fetched (or reused) again.
            adopted = self.ctx.writer.adopt(record)
            receipts.append(adopted)
            return adopted is not None

        index = planned.index or ContentIndex.of_store(self.store, self.repo_id,
                                                       exclude_commit=self.commit)
        plan = plan_files(self.repo_id, self.commit, files, verified, index, still_stored)
        self.tally.note(f"plan for {self.repo_id}@{self.commit[:12]}: {plan.describe()}")
        self.tally.planned(files, {p.path for p in plan.files if p.action != "download"}, plan)
        return plan, receipts

    def _present(self, entry: VerifiedEntry, receipts: list[PutReceipt | None]) -> VerifiedEntry:
        receipts.append(self.ctx.store_entry(entry))
        self.tally.file_done(entry.record, reused=True)
        return entry

    def _reuse_while_fetching(
        self,
        runner: Runner,
        planned: list[PlannedFile],
        by_path: dict[str, RemoteFile],
        todo: list[RemoteFile],
        entries: list[VerifiedEntry],
        receipts: list[PutReceipt | None],
    ) -> tuple[int, list[RemoteFile], int]:
        """Take the planned files from published revisions inside the store while the jobs
        download ``todo``; return the bytes reused, the files to download instead, and the
        bytes downloaded.

        A reuse is a few small requests (a thread pool of this process rather than jobs), a
        download is bandwidth and hashing, so the two overlap: a commit changing one shard
        costs about that shard's transfer, not also a round of requests per unchanged file
        before it (issue 22). A failed download cancels the reuses not yet started, and the
        run fails only once none is in flight: nothing writes into a revision being dropped."""
        pool = ThreadPoolExecutor(REUSE_THREADS, thread_name_prefix="k3a-reuse")
        try:
            futures = [(p, pool.submit(self._reuse_one, by_path[p.path], p)) for p in planned]
            downloaded, failures = self._run_jobs(runner, todo, entries, receipts)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True, cancel_futures=failures is not None)
        if failures is not None:
            self._fail(*failures)
        reused = 0
        fallbacks: list[RemoteFile] = []
        for p, fut in futures:
            try:
                entry, receipt = fut.result()
            except ReuseFailed as exc:
                self.tally.note(f"{p.path}: not reused ({exc}); downloading it instead")
                self.fallback_reasons.append(str(exc))
                fallbacks.append(by_path[p.path])
                continue
            entries.append(entry)
            receipts.append(receipt)
            reused += entry.record.size
        return reused, sorted(fallbacks, key=lambda f: -f.size), downloaded

    def _reuse_one(
        self, remote: RemoteFile, planned: PlannedFile
    ) -> tuple[VerifiedEntry, PutReceipt | None]:
        assert planned.source_commit is not None and planned.source_path is not None
        record = reused_record(remote, planned)
        with self.ctx.in_store(record.path):
            receipt = self.ctx.writer.reuse(
                record, planned.source_commit, planned.source_path,
                reverify=self.options.reverify_reused,
            )
        if receipt is None:
            # A peer published this revision meanwhile (a shared FSx tree): nothing of ours
            # is read back from it; the download path ends in commit() comparing manifests.
            raise ReuseFailed(f"{record.path}: {self.repo_id}@{self.commit} was published "
                              "by another run meanwhile")
        tensors = None
        if record.kind == "weights":
            # The index check needs the shard's tensor names; the header (a few KB of the
            # copy, read back from the store by range: one read at the length recorded when
            # it was first staged) is checked again as a download's would be.
            recorded = record.safetensors.header_len if record.safetensors else None
            try:
                info = check_header_at(
                    record.path, functools.partial(self.ctx.writer.read_staged, record.path),
                    record.size, recorded)
            except Refusal as exc:
                raise ReuseFailed(f"{record.path}: {exc}") from None
            if record.safetensors is not None and info.summary != record.safetensors:
                raise ReuseFailed(
                    f"{record.path}: the copy's safetensors header differs from the one "
                    f"recorded in {planned.source_commit[:12]}"
                )
            record = record.model_copy(update={"safetensors": info.summary})
            tensors = sorted(info.tensor_names)
        entry = VerifiedEntry(record=record, mtime_ns=0, tensors=tensors, stored=True)
        # Logged as stored, so a re-run after a crash finds it in the store-side revision.
        self.quarantine.mark_stored(entry)
        faultpoints.pause("reused", record.path)
        self.tally.file_done(record, reused=True)
        return entry, receipt

    def _fetch(
        self,
        runner: Runner,
        todo: list[RemoteFile],
        entries: list[VerifiedEntry],
        receipts: list[PutReceipt | None],
    ) -> int:
        """Run a job per file; collect what verified; fail the run if any did not."""
        downloaded, failures = self._run_jobs(runner, todo, entries, receipts)
        if failures is not None:
            self._fail(*failures)
        return downloaded

    def _run_jobs(
        self,
        runner: Runner,
        todo: list[RemoteFile],
        entries: list[VerifiedEntry],
        receipts: list[PutReceipt | None],
    ) -> tuple[int, tuple[list[Refusal], list[tuple[str, BaseException]]] | None]:
        """Run a job per file; collect what verified, stop starting new jobs at the first
        failure (running ones finish, so their partial files stay resumable). Returns the
        bytes downloaded and, if any file failed, the refusals and errors."""
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
        return downloaded, (refusals, errors) if refusals or errors else None

    def _fail(self, refusals: list[Refusal], errors: list[tuple[str, BaseException]]
              ) -> NoReturn:
        """Refused files drop the revision being written; any other failure keeps it (a
        re-run resumes)."""
        if refusals:
            self.ctx.writer.abort()
            raise ReleaseRefused(sorted(refusals, key=lambda r: r.path))
        raise _one_failure(errors)

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
