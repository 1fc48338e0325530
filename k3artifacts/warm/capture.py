"""``k3a warm capture``: a server's cache directories -> a warm-start artifact of its tuple,
planned (the capturer may sign warm manifests, every file listed and checked, the key free),
then stored: the manifest a signed record of the capturer (role ``warm``; :mod:`.trust`).

Each captured tree is hostile input (a hostPath other pods write to): it is walked through
directory descriptors with ``O_NOFOLLOW`` (:mod:`k3artifacts.nodecache.safefs`), and a link,
a FIFO or device, a tree nested deeper than the walk allows, or a path deeper or longer than a
node can hold (:func:`~.model.check_relative`) refuses the whole capture, named (exit 9):
nothing is stored, since a cache we cannot read faithfully is not a cache to
hand to other nodes.

Cost: one listing of the blob prefix says which contents the store already holds; every file
is then read once (hashed as read: sha256 and xxh3-128) by a thread pool and, when new, put
under its sha256 with an exclusive create. Bytes in flight are capped (:data:`IN_FLIGHT`), so
memory stays flat whatever the number of files. The manifest is created last, once (unless
the one already at its key is one the channel would not use: :mod:`.claim`): a reader never
sees an artifact whose blobs are not all there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from k3artifacts.errors import AlreadyExists, ConfigError, UsageError
from k3artifacts.nodecache import safefs
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.record import in_force
from k3artifacts.policy.signed import require_role, signed_bytes
from k3artifacts.releases.lookup import resolve_tuple
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.revisions.hashing import MultiHasher
from k3artifacts.signing.attestation import statement
from k3artifacts.signing.keys import KeyReference, ReleaseSigner
from k3artifacts.stores.base import Store
from k3artifacts.trust.keys import release_signer
from k3artifacts.warm.claim import check_claim, publish
from k3artifacts.warm.model import (
    BLOB_PREFIX,
    CACHE_ROOTS,
    PREDICATE_TYPE,
    WarmFile,
    WarmManifest,
    artifact_key,
    blob_key,
    check_relative,
    detect_gpu,
    layout_name,
    predicate,
    tuple_layout,
)
from k3artifacts.warm.trust import WARM_MANIFESTS, WarmTrust, warm_trust

#: Bytes read but not yet stored, across the pool: what bounds memory.
IN_FLIGHT = 256 << 20
#: A single cache file above this is refused (a cache of compiled kernels holds nothing near
#: it; a file that large is not what we think it is).
MAX_FILE = 1 << 30
WORKERS = 16


@dataclass(frozen=True)
class CaptureRoot:
    name: str
    path: Path


def parse_roots(specs: list[str]) -> list[CaptureRoot]:
    """``NAME=DIR`` (or a DIR whose basename is a cache name) for each captured directory."""
    roots: dict[str, CaptureRoot] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path, name = spec, Path(spec).name.lstrip(".")
        if name not in CACHE_ROOTS:
            raise UsageError(
                f"{spec!r}: {name!r} is not a cache this artifact can carry",
                hint="name each directory: " + ", ".join(f"{n}=DIR ({v})"
                                                          for n, v in CACHE_ROOTS.items()))
        if name in roots:
            raise UsageError(f"cache {name!r} is given twice")
        roots[name] = CaptureRoot(name, Path(path))
    if not roots:
        raise UsageError("no cache directory given", hint="e.g. triton=$TRITON_CACHE_DIR")
    return list(roots.values())


@dataclass
class CaptureResult:
    key: str
    digest: str
    files: int
    bytes: int
    blobs_new: int
    bytes_new: int
    #: The identity whose key signed the manifest's record.
    captured_by: str
    #: The release key that signed it too, if one was given.
    signed_by: str | None
    seconds: float
    #: Why the artifact that held the key before was replaced (the channel would not use it).
    replaced: str | None = None


class _Budget:
    """A byte semaphore: acquire before reading a file, release once it is stored."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self.cond = threading.Condition()

    def acquire(self, n: int) -> None:
        with self.cond:
            # A file larger than the whole budget runs alone.
            self.cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    def release(self, n: int) -> None:
        with self.cond:
            self.used -= n
            self.cond.notify_all()


@dataclass(frozen=True)
class _Job:
    root: CaptureRoot
    rel: str
    size: int


def _list(root: CaptureRoot) -> list[_Job]:
    try:
        top = safefs.open_root(root.path, create=False)
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"cache directory {root.path} ({root.name}) does not exist",
                          hint="pass the directory the server compiled into") from None
    with top:
        jobs = []
        for _, _, rel, st in safefs.walk_files(top):
            try:
                check_relative(rel)
            except ValueError as exc:  # no node could hold it: refused before anything is stored
                raise ConfigError(f"{root.path}: {exc}; not captured") from None
            if st.st_size > MAX_FILE:
                raise ConfigError(f"{root.path / rel}: {st.st_size:,} bytes; a cache file "
                                  f"above {MAX_FILE:,} is not captured")
            jobs.append(_Job(root, rel, st.st_size))
        return jobs


def _read(job: _Job) -> tuple[bytes, bool]:
    """The file's bytes and owner-execute bit, reached again without following a link."""
    parts = job.rel.split("/")
    with safefs.open_root(job.root.path, create=False) as top, top.walk(parts[:-1]) as parent:
        fd = parent.open_regular(parts[-1], os.O_RDONLY)
        try:
            st = os.fstat(fd)
            chunks = []
            while chunk := os.read(fd, 8 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
    return b"".join(chunks), bool(st.st_mode & 0o100)


@dataclass(frozen=True)
class CapturePlan:
    """A capture whose every file was listed and checked; nothing stored yet."""

    release: ReleaseTuple
    gpu: str
    tensor_parallel: int
    pipeline_parallel: int
    roots: tuple[CaptureRoot, ...]
    jobs: tuple[_Job, ...]
    #: Who captures, with the key the manifest's record is signed with.
    by: Acting
    #: A release key whose signature the channel's release rule may ask for, besides.
    signer: ReleaseSigner | None
    #: The channel's rule for what stands at the key (:mod:`.claim`); None: whatever is there.
    trust: WarmTrust | None
    #: The manifest's key: the tuple, the GPU model and the layout.
    key: str


def plan_capture(store: Store, release: ReleaseTuple, *, gpu: str, tensor_parallel: int,
                 pipeline_parallel: int, roots: list[CaptureRoot], by: Acting,
                 signer: ReleaseSigner | None = None,
                 trust: WarmTrust | None = None) -> CapturePlan:
    """RoleRefused (exit 9) for a capturer without the role ``warm``; list and check every file
    under ``roots`` (a link, FIFO or device refuses the capture, ConfigError exit 9);
    AlreadyCaptured (exit 6) when the tuple has an artifact for this GPU and layout that
    stands: one the channel would use, or one this capture may not replace
    (:func:`~.claim.check_claim`)."""
    require_role(by, "warm-manifest", "a warm-start capture")
    jobs = tuple(job for root in roots for job in _list(root))
    key = artifact_key(release.id, gpu.strip(), layout_name(tensor_parallel, pipeline_parallel))
    check_claim(store, release, key, gpu=gpu.strip(), tp=tensor_parallel, pp=pipeline_parallel,
                signer=signer, trust=trust)
    return CapturePlan(release, gpu.strip(), tensor_parallel, pipeline_parallel, tuple(roots),
                       jobs, by, signer, trust, key)


def act_capture(store: Store, plan: CapturePlan, *, workers: int = WORKERS,
                on_file: Callable[[int], None] | None = None) -> CaptureResult:
    """Store each file once under its sha256, then the manifest, signed by the capturer
    (create-once: a capture that got there first stands, AlreadyCaptured), then its release
    signature, if a release key was given."""
    started = datetime.now(UTC)
    jobs = plan.jobs
    have = {key.rsplit("/", 1)[-1] for key in store.list_keys(BLOB_PREFIX)}
    records: list[WarmFile | None] = [None] * len(jobs)
    new = {"blobs": 0, "bytes": 0}
    lock = threading.Lock()
    budget = _Budget(IN_FLIGHT)

    def one(i: int, job: _Job) -> None:
        try:
            data, executable = _read(job)
            hasher = MultiHasher()
            hasher.update(data)
            d = hasher.hexdigests()
            assert d.sha256 is not None and d.xxh3_128 is not None
            with lock:
                fresh = d.sha256 not in have
                have.add(d.sha256)
            if fresh:
                try:
                    store.create(blob_key(d.sha256), data)
                    with lock:
                        new["blobs"] += 1
                        new["bytes"] += len(data)
                except AlreadyExists:
                    pass  # another capture stored the same content meanwhile
            records[i] = WarmFile(root=job.root.name, path=job.rel, size=len(data),
                                  sha256=d.sha256, xxh3_128=d.xxh3_128, executable=executable)
        finally:
            budget.release(job.size)
        if on_file is not None:
            on_file(len(data))

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="warm-capture") as pool:
        futures: list[Future[None]] = []
        for i, job in enumerate(jobs):
            budget.acquire(job.size)
            futures.append(pool.submit(one, i, job))
        for future in futures:
            future.result()  # the first failure (a link planted meanwhile) ends the capture
    files = [r for r in records if r is not None]
    release = plan.release
    manifest = WarmManifest(
        tuple_id=release.id, image_digest=release.binding.image.digest,
        serving_args=list(release.binding.serving.args), gpu=plan.gpu,
        tensor_parallel=plan.tensor_parallel, pipeline_parallel=plan.pipeline_parallel,
        roots=sorted(r.name for r in plan.roots),
        files=sorted(files, key=lambda f: (f.root, f.path)),
        total_bytes=sum(f.size for f in files), captured_at=started,
        captured_by=plan.by.name,
    )
    record = signed_bytes(store, manifest.key, WARM_MANIFESTS, manifest, by=plan.by)
    signer = plan.signer
    signature = None if signer is None else signer.sign(
        statement(manifest.key, manifest.digest(), PREDICATE_TYPE, predicate(manifest)))
    replaced = publish(store, release, manifest, record, signature, signer, plan.trust)
    return CaptureResult(manifest.key, manifest.digest(), len(files), manifest.total_bytes,
                         new["blobs"], new["bytes"], plan.by.name,
                         signer.key_hint if signer else None,
                         round((datetime.now(UTC) - started).total_seconds(), 3), replaced)


def capture(store: Store, release: ReleaseTuple, *, gpu: str, tensor_parallel: int,
            pipeline_parallel: int, roots: list[CaptureRoot], by: Acting,
            signer: ReleaseSigner | None = None, workers: int = WORKERS,
            on_file: Callable[[int], None] | None = None,
            trust: WarmTrust | None = None) -> CaptureResult:
    """:func:`plan_capture`, then :func:`act_capture`. ``trust``: the channel's rule, which
    says whether an artifact already at the key stands (:mod:`.claim`); None: whatever is
    there stands."""
    plan = plan_capture(store, release, gpu=gpu, tensor_parallel=tensor_parallel,
                        pipeline_parallel=pipeline_parallel, roots=roots, by=by,
                        signer=signer, trust=trust)
    return act_capture(store, plan, workers=workers, on_file=on_file)


def capture_target(store: Store, target: str, dirs: list[str], *, by: Acting,
                   gpu: str | None = None, tp: int | None = None,
                   signing_key: str | KeyReference | None = None,
                   channel: str | None = None) -> CaptureResult:
    """The warm-capture move as ``k3a warm capture`` names it: ``target`` a tuple or a
    channel, ``dirs`` ``NAME=DIR`` specs, the GPU detected with nvidia-smi unless given, the
    layout the tuple's unless ``tp`` overrides it, the capturer ``by`` (the identity whose key
    signs, never a typed name), judged by ``channel``'s warm-start rule (None: the tuple's own
    trust rule of no channel)."""
    release = resolve_tuple(store, target)
    roots = parse_roots(dirs)
    gpu = gpu or detect_gpu()
    if not gpu:
        raise UsageError("no GPU found (nvidia-smi)", hint="pass --gpu MODEL")
    want_tp, pp = tuple_layout(release)
    signer = release_signer(signing_key) if signing_key else None
    trust = warm_trust(in_force(store), channel)
    return capture(store, release, gpu=gpu, tensor_parallel=tp or want_tp, pipeline_parallel=pp,
                   roots=roots, by=by, signer=signer, trust=trust)

