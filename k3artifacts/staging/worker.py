"""The per-file work of staging: download one file, hash it as it arrives, check it, hand it to
the store. It runs wherever the runner puts it: a thread of the staging process, or a worker
process on another machine (Prefect tasks on Dask or Kubernetes).

A job is plain picklable values (:class:`FileJob`). The process that runs it finds the live
objects of its run in :data:`_LIVE` when it is the staging process itself (same quarantine,
same store writer, same progress observer), and otherwise rebuilds a context once per process
from the job's :class:`RunSpec`: its own Hub client, its own store writer (opening one has no
side effect on other writers) and its own local quarantine when the run has no shared disk.
A worker without a shared disk removes its local copy as soon as the store holds the file and
returns only a small verified record; the staging process reads back from the store the few
small files the manifest needs (index, license, card).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts import faultpoints
from k3artifacts.budget import ByteBudget
from k3artifacts.errors import Refusal, Unavailable
from k3artifacts.net.attempt import PermanentError
from k3artifacts.net.policy import RetryPolicy
from k3artifacts.revisions.hashing import MultiHasher
from k3artifacts.revisions.manifest import FileRecord
from k3artifacts.settings import default_quarantine, default_workers
from k3artifacts.signing.keys import KeyReference
from k3artifacts.staging.download import Ranges, fetch, kept_prefix
from k3artifacts.staging.events import StageObserver
from k3artifacts.staging.hub import HubSource, RemoteFile
from k3artifacts.staging.plan import matches_listing
from k3artifacts.staging.quarantine import Quarantine, VerifiedEntry
from k3artifacts.staging.rules import file_kind
from k3artifacts.staging.safetensors_header import check_header
from k3artifacts.stores.base import (
    SMALL_FILE,
    PutReceipt,
    RevisionWriter,
    StreamedPut,
)
from k3artifacts.stores.registry import open_store
from k3artifacts.stores.revisions import RevisionStore


@dataclass(frozen=True)
class StageOptions:
    allow_pickle: bool = False
    workers: int = field(default_factory=default_workers)
    #: Read from the settings (``K3A_HTTP_*``) when the options are made, not at import.
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: Streams per large file, and the size of the ranges they fetch.
    ranges: Ranges = Ranges()
    #: Keep the quarantine copy after publishing (default: remove it, it is in the store now).
    keep_quarantine: bool = False
    #: Bound on local quarantine disk: weights in flight plus verified-but-not-yet-stored stay
    #: under this many bytes, and a shard's local copy is deleted once the store has it. For a
    #: checkpoint larger than the staging worker's disk (S3, or an FSx mount off local NVMe).
    window_bytes: int | None = None
    #: The key to sign the revision with once it is published (``.k3a/model.sig``): a key
    #: reference (a PEM file, kms:KEY, a pkcs11: URI); read by the coordinating process only,
    #: never by a worker.
    signing_key: str | KeyReference | None = None
    #: Re-hash files reused from a published revision after the store copied them, where the
    #: store keeps no checksum of its own (a file tree: xxh3-128; S3 always checks CRC64NVME).
    reverify_reused: bool = False


@dataclass(frozen=True)
class RunSpec:
    """What a worker needs to rebuild a run in its own process (the HF token and AWS
    credentials come from that worker's environment, never from here)."""

    run_id: str
    endpoint: str
    store_url: str
    repo_id: str
    commit: str
    #: The run's quarantine when workers share it (a file store / FSx tree); None when each
    #: worker keeps its own local one (``$K3A_QUARANTINE`` or the user cache) and drops files
    #: once stored.
    quarantine_root: str | None
    options: StageOptions


@dataclass(frozen=True)
class FileJob:
    spec: RunSpec
    remote: RemoteFile


@dataclass(frozen=True)
class FileOutcome:
    """A verified file, as a worker reports it back: small, whatever the file's size."""

    entry: VerifiedEntry
    #: Bytes this job received from the Hub (less than the size when it resumed a partial).
    downloaded: int
    receipt: PutReceipt | None


class RunContext:
    """The live objects of one run in one process; thread-safe."""

    def __init__(
        self,
        spec: RunSpec,
        source: HubSource,
        store: RevisionStore,
        writer: RevisionWriter,
        quarantine: Quarantine,
        observer: StageObserver,
        *,
        drop_when_stored: bool,
    ):
        self.spec = spec
        self.source = source
        self.store = store
        self.writer = writer
        self.quarantine = quarantine
        self.observer = observer
        #: A worker-local quarantine: nobody reads its files after the store has them.
        self.drop_when_stored = drop_when_stored
        self.budget = ByteBudget(spec.options.window_bytes)
        writer.expect_files(spec.options.workers)
        self._headers = source.headers()
        self._want_crc = "crc64nvme" in store.wanted_checksums
        self._accepted: dict[str, VerifiedEntry] = {}

    def run(self, remote: RemoteFile) -> FileOutcome:
        weights = file_kind(remote.path) == "weights"
        with self.budget.held(remote.size if weights else 0):
            found = self._accepted.get(remote.path)
            if found is not None and matches_listing(found.record, remote):
                # A retried task whose earlier attempt verified the file, then failed to store.
                entry, downloaded = found, 0
            else:
                entry, downloaded, streamed = self._download(remote)
                self._accepted[remote.path] = entry
            receipt = self.store_entry(entry, streamed)
        return FileOutcome(entry, downloaded, receipt)

    def store_entry(
        self, entry: VerifiedEntry, streamed: StreamedPut | None = None
    ) -> PutReceipt | None:
        """Hand a verified file to the store (finishing what was sent while it downloaded),
        then drop the local copy where nobody needs it."""
        if entry.stored:  # adopted from an earlier run's store-side work: nothing to hand over
            return None
        record = entry.record
        local = self.quarantine.final_path(record.path)
        with self.in_store(record.path):
            receipt = None
            if streamed is not None:
                receipt = streamed.finish(record, entry.checksums, local)
            if receipt is None:
                receipt = self.writer.put_file(record, local, checksums=entry.checksums)
        # Weights leave a shared quarantine early under a window; small files stay, since the
        # manifest is built from them (index, license, card).
        if self.drop_when_stored or (
            self.spec.options.window_bytes is not None and record.kind == "weights"
        ):
            with self._in_quarantine(record.path):
                self.quarantine.mark_stored(entry)
        return receipt

    def _download(self, remote: RemoteFile) -> tuple[VerifiedEntry, int, StreamedPut | None]:
        """Fetch and verify one file. Where the store takes it so, the file is sent to the
        store as it lands (each byte read back once, from the page cache, while the download
        goes on); the returned :class:`StreamedPut` is finished once the file is verified."""
        part = self.quarantine.part_path(remote.path)
        self.observer.file_started(remote.path, remote.size)
        if not remote.lfs_sha256 and not remote.git_oid:
            raise Refusal(remote.path, "unverifiable", "the hub lists no sha256 or git blob id")
        git_size = remote.size if remote.git_oid else None
        received = 0
        lock = threading.Lock()

        def counted(n: int) -> None:
            nonlocal received
            with lock:
                received += n
            self.observer.advance(remote.path, n)

        with self._in_quarantine(remote.path):
            kept = kept_prefix(part, remote.size, remote.expected(self.spec.commit))
            if kept:
                self.observer.file_resumed(remote.path, kept)
            streamed: StreamedPut | None = None
            if remote.lfs_sha256 and self._want_crc:
                streamed = self.writer.begin_put(remote.path, remote.size, remote.lfs_sha256,
                                                 part)
            # The fsync makes a verified file trustworthy after an OS crash without reading it
            # again. A file streamed to the store is durable there once its upload completes;
            # its local copy is only a cache, so it goes unsynced (a re-run re-hashes it before
            # any use, as it does small files). On 16 cores the fsyncs of 8 multi-GB shards at
            # once held staging to the local disk's write rate, a disk no byte is read from.
            durable = remote.size >= SMALL_FILE and streamed is None
            try:
                entry = self._fetch_checked(remote, part, git_size, counted, durable,
                                            None if streamed is None else streamed.written)
            except BaseException:
                if streamed is not None:
                    streamed.cancel()
                raise
        return entry, received, streamed

    def _fetch_checked(self, remote: RemoteFile, part: Path, git_size: int | None,
                       counted: Callable[[int], None], durable: bool,
                       on_prefix: Callable[[int], None] | None) -> VerifiedEntry:
        try:
            hasher = fetch(
                self.source.file_url(self.spec.repo_id, self.spec.commit, remote.path),
                self._headers,
                part,
                remote.size,
                lambda: MultiHasher(git_blob_size=git_size, crc64nvme=self._want_crc),
                policy=self.spec.options.retry,
                ranges=self.spec.options.ranges,
                on_bytes=counted,
                on_prefix=on_prefix,
                on_resumed=lambda n: self.observer.advance(remote.path, n),
                label=remote.path,
                durable=durable,
                expected=remote.expected(self.spec.commit),
            )
        except PermanentError as exc:
            raise Refusal(remote.path, "download", str(exc)) from None
        faultpoints.pause("downloaded", remote.path)
        try:
            record, tensors = check_file(remote, part, hasher)
        except Refusal:
            # Wrong bytes are not worth resuming from: the next attempt starts clean.
            self.quarantine.discard(part)
            raise
        return self.quarantine.accept(
            record, part, tensors, hasher.extra_checksums(), durable=durable
        )

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
    def in_store(self, path: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise Unavailable(
                f"{path}: writing to store {self.store.url}: {exc.strerror or exc}",
                hint="free space in the store (or fix its permissions), then re-run: "
                "files verified in quarantine are reused, nothing was published",
            ) from None


def check_file(
    remote: RemoteFile, part: Path, hasher: MultiHasher
) -> tuple[FileRecord, frozenset[str] | None]:
    """Hold the received bytes to the listing (size, LFS sha256 or git blob id) and check a
    safetensors header; raise :class:`Refusal` naming the file and the rule."""
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


#: Contexts of the runs this process coordinates, by run id (their jobs run here in threads).
_LIVE: dict[str, RunContext] = {}
#: Contexts rebuilt by this process for runs coordinated elsewhere.
_REBUILT: dict[RunSpec, RunContext] = {}
_REBUILT_LOCK = threading.Lock()


def register(ctx: RunContext) -> None:
    _LIVE[ctx.spec.run_id] = ctx


def unregister(ctx: RunContext) -> None:
    _LIVE.pop(ctx.spec.run_id, None)


def context_for(spec: RunSpec) -> RunContext:
    live = _LIVE.get(spec.run_id)
    if live is not None:
        return live
    with _REBUILT_LOCK:
        ctx = _REBUILT.get(spec)
        if ctx is None:
            ctx = _rebuild(spec)
            _REBUILT[spec] = ctx
        return ctx


def _rebuild(spec: RunSpec) -> RunContext:
    store = open_store(spec.store_url)
    shared = spec.quarantine_root is not None
    root = Path(spec.quarantine_root) if shared else default_quarantine(None)
    # Not entered (no lock): the revision lock belongs to the coordinating process, whose run
    # these tasks are; each task writes its own partial and verified files.
    quarantine = Quarantine(root, spec.repo_id, spec.commit)
    quarantine.files.mkdir(parents=True, exist_ok=True)
    quarantine.partial.mkdir(exist_ok=True)
    return RunContext(
        spec,
        HubSource(endpoint=spec.endpoint, retry=spec.options.retry),
        store,
        store.begin_revision(spec.repo_id, spec.commit),
        quarantine,
        StageObserver(),
        drop_when_stored=not shared,
    )


def run_file_job(job: FileJob) -> FileOutcome:
    """Fetch, check and store one file of a run, in whatever process this is."""
    return context_for(job.spec).run(job.remote)
