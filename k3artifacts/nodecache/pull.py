"""``k3a pull``: put a release's weights under a node cache root, verified, atomically.

The order of work for one revision, under its exclusive lock (two pulls of one tuple on one
node: the second waits, then finds the first's complete copy):

1. the manifest is read from the weights' store and its digest held to the one the tuple
   binds: every later check trusts this manifest and nothing else;
2. files are planned: kept when an earlier, interrupted run verified them (its
   ``verified.jsonl``), hard-linked when another cached revision holds the same sha256, else
   fetched (:mod:`.fetch`: ranged reads, hashed as they arrive, resumed part by part);
3. the partial directory gets the manifest and a verified marker and is renamed onto
   ``models/<org>/<name>/<commit>``: the revision appears complete or not at all.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts.errors import ConfigError, Conflict, NotFound, VerifyMismatch
from k3artifacts.nodecache import locks
from k3artifacts.nodecache.fetch import Fetcher, FileJob, Tuning
from k3artifacts.nodecache.layout import (
    VERIFIED_LOG,
    VERIFIED_NAME,
    CacheLayout,
    Revision,
    VerifiedFile,
    VerifiedMarker,
)
from k3artifacts.nodecache.retention import evict
from k3artifacts.nodecache.sources import open_source
from k3artifacts.releases.lookup import resolve_tuple
from k3artifacts.revisions.manifest import (
    MANIFEST_NAME,
    META_DIR,
    FileRecord,
    ShardManifest,
    manifest_key,
    revision_prefix,
)
from k3artifacts.revisions.refs import match_revision_ref
from k3artifacts.stores.base import Store
from k3artifacts.stores.registry import open_store


@dataclass(frozen=True)
class PullTarget:
    revision: Revision
    #: The manifest digest to hold the store's manifest to (the tuple's; None: whatever the
    #: store has, for a bare org/name@commit).
    manifest_digest: str | None
    tuple_id: str | None
    store: Store


def resolve_target(store: Store, name: str) -> PullTarget:
    """A tuple id, a channel (its current tuple) or ``org/name@commit`` (a published revision
    of ``store``). A tuple's weights are read from the store its binding names."""
    ref = match_revision_ref(name)
    if ref is not None:
        return PullTarget(Revision(ref[0], ref[1]), None, None, store)
    release = resolve_tuple(store, name)
    weights = release.binding.weights
    location = weights.location.rstrip("/")
    suffix = "/" + revision_prefix(weights.repo_id, weights.commit)
    if not location.endswith(suffix):
        raise ConfigError(f"tuple {release.id}: weights location {location} does not end in "
                          f"{suffix}")
    url = location[: -len(suffix)]
    weights_store = store if url.rstrip("/") == store.url.rstrip("/") else open_store(url)
    return PullTarget(Revision(weights.repo_id, weights.commit), weights.manifest_digest,
                      release.id, weights_store)


@dataclass
class PullResult:
    revision: str
    tuple_id: str | None
    manifest_digest: str
    path: str
    files: int
    bytes: int
    #: Bytes read from the store by this run.
    bytes_fetched: int = 0
    #: Bytes hard-linked from other cached revisions (same sha256).
    bytes_reused: int = 0
    #: Bytes an interrupted run left verified or recorded on disk.
    bytes_resumed: int = 0
    files_fetched: int = 0
    files_linked: int = 0
    files_kept: int = 0
    already_present: bool = False
    algorithms: list[str] = field(default_factory=list)
    seconds: float = 0.0
    evicted: list[str] = field(default_factory=list)


@dataclass
class PullObserver:
    """Hooks for displays: ``planned(total, already)`` once, ``advance(nbytes)`` as bytes
    land, ``note(text)`` for events worth a line."""

    planned: Callable[[int, int], None] = lambda total, already: None
    advance: Callable[[int], None] = lambda nbytes: None
    note: Callable[[str], None] = lambda text: None


def _safe_path(base: Path, rel: str) -> Path:
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] == META_DIR:
        raise VerifyMismatch(f"{rel}: not a safe relative path; refusing to write it")
    return base.joinpath(*parts)


def _read_verified_log(path: Path) -> dict[str, VerifiedFile]:
    found: dict[str, VerifiedFile] = {}
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return found
    for line in lines:
        try:
            entry = VerifiedFile.model_validate_json(line)
        except ValueError:
            continue  # a line torn by a crash: that file is simply checked again
        found[entry.path] = entry
    return found


def sha256_index(layout: CacheLayout, exclude: Revision) -> dict[str, tuple[Path, FileRecord]]:
    """sha256 -> (file, record) over every complete cached revision but ``exclude``."""
    index: dict[str, tuple[Path, FileRecord]] = {}
    for rev in layout.revisions():
        if rev == exclude:
            continue
        manifest = layout.manifest(rev)
        if manifest is None:
            continue
        base = layout.final_dir(rev)
        for record in manifest.files:
            index.setdefault(record.sha256, (base.joinpath(*record.path.split("/")), record))
    return index


class _VerifiedLog:
    """Appends one line per verified file, synced: what a re-run keeps without re-reading."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "ab")
        self.lock = threading.Lock()

    def add(self, record: FileRecord) -> None:
        line = VerifiedFile(path=record.path, size=record.size, xxh3_128=record.xxh3_128)
        with self.lock:
            self.fh.write(line.model_dump_json().encode() + b"\n")
            self.fh.flush()
            os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


def _sweep(partial: Path, listed: set[str]) -> None:
    """Delete what the manifest does not list (a part file an earlier run left for a file this
    run hard-linked instead): the revision directory must hold exactly the manifest's files,
    or `k3a verify` refuses it."""
    for dirpath, _, filenames in os.walk(partial):
        rel = Path(dirpath).relative_to(partial).as_posix()
        if rel == META_DIR or rel.startswith(META_DIR + "/"):
            continue
        for name in filenames:
            path = name if rel == "." else f"{rel}/{name}"
            if path not in listed:
                os.unlink(os.path.join(dirpath, name))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pull(target: PullTarget, root: Path, *, tuning: Tuning | None = None,
         observer: PullObserver | None = None) -> PullResult:
    tuning = tuning or Tuning()
    observer = observer or PullObserver()
    layout = CacheLayout(root)
    rev = target.revision
    started = time.monotonic()
    with locks.exclusive(layout.lock_file(rev),
                         on_wait=lambda: observer.note(f"waiting for another pull of {rev}")):
        result = _pull_locked(target, layout, tuning, observer)
    # The lease file exists before any server starts: `flock -s FILE` on a read-only mount
    # can then open it.
    layout.lease_file(rev).parent.mkdir(parents=True, exist_ok=True)
    layout.lease_file(rev).touch()
    layout.touch_used(rev)
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _read_manifest(target: PullTarget) -> tuple[bytes, ShardManifest]:
    rev = target.revision
    found = target.store.read(manifest_key(rev.repo_id, rev.commit))
    if found is None:
        raise NotFound(f"{rev} is not published in {target.store.url}",
                       hint="check the tuple's store (--store) or stage the revision first")
    manifest = ShardManifest.parse(found.data)
    if target.manifest_digest is not None and not manifest.answers_to(target.manifest_digest):
        raise VerifyMismatch(
            f"{rev} in {target.store.url}: manifest digest {manifest.digest()}, the tuple "
            f"{target.tuple_id} binds {target.manifest_digest}; nothing was pulled",
            hint="the store's manifest was replaced behind the tuple: do not serve it; "
            "investigate the store",
        )
    return found.data, manifest


def _pull_locked(target: PullTarget, layout: CacheLayout, tuning: Tuning,
                 observer: PullObserver) -> PullResult:
    rev = target.revision
    final = layout.final_dir(rev)
    marker = layout.marker(rev)
    if marker is not None and target.manifest_digest in (None, marker.manifest_digest):
        observer.planned(marker.bytes, marker.bytes)
        return PullResult(str(rev), target.tuple_id, marker.manifest_digest, str(final),
                          marker.files, marker.bytes, already_present=True,
                          algorithms=marker.algorithms)
    raw, manifest = _read_manifest(target)
    if final.exists():
        # The same commit with another manifest (or no marker): not what the tuple binds.
        observer.note(f"{final} holds another copy of {rev}; replacing it")
        if not evict(layout, rev, locked=True):
            raise Conflict(f"{final} holds a different copy of {rev} and a server leases it",
                           hint="stop the server using it, then pull again")

    partial = layout.partial_dir(rev)
    meta = partial / META_DIR
    meta.mkdir(parents=True, exist_ok=True)
    verified = _read_verified_log(meta / VERIFIED_LOG)
    source = open_source(target.store, rev.repo_id, rev.commit, tuning.pool_connections)
    fetcher = Fetcher(source, tuning, on_bytes=observer.advance)
    result = PullResult(str(rev), target.tuple_id, manifest.digest(), str(final),
                        len(manifest.files), manifest.total_bytes)
    index: dict[str, tuple[Path, FileRecord]] | None = None
    vlog = _VerifiedLog(meta / VERIFIED_LOG)
    jobs: list[FileJob] = []
    try:
        for record in manifest.files:
            dest = _safe_path(partial, record.path)
            done = verified.get(record.path)
            if (done is not None and done.size == record.size
                    and done.xxh3_128 == record.xxh3_128 and dest.is_file()
                    and dest.stat().st_size == record.size):
                result.files_kept += 1
                result.bytes_resumed += record.size
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.unlink(missing_ok=True)  # there but never verified: not trusted
            if index is None:
                index = sha256_index(layout, rev)
            held = index.get(record.sha256)
            if held is not None and held[1].size == record.size \
                    and held[1].xxh3_128 == record.xxh3_128:
                try:
                    os.link(held[0], dest)
                except OSError:
                    pass  # gone meanwhile, or another file system: fetch it
                else:
                    vlog.add(record)
                    result.files_linked += 1
                    result.bytes_reused += record.size
                    continue
            jobs.append(fetcher.job(record, dest,
                                    source.checksums.get(record.path, {}).get("crc64nvme")))
        resumed = sum(j.resumed_bytes for j in jobs)
        observer.planned(manifest.total_bytes,
                         result.bytes_resumed + result.bytes_reused + resumed)
        if result.files_linked:
            observer.note(f"reused {result.files_linked} file(s), {result.bytes_reused:,} "
                          "bytes, from other cached revisions (hard links)")
        fetcher.on_verified = vlog.add
        totals = fetcher.run(jobs)
    finally:
        vlog.close()
        source.close()
    result.files_fetched = totals.files
    result.bytes_fetched = totals.bytes_fetched
    result.bytes_resumed += totals.bytes_resumed
    result.algorithms = ["xxh3-128"] + (["crc64nvme"] if source.checksums else [])

    _sweep(partial, {r.path for r in manifest.files})
    (meta / MANIFEST_NAME).write_bytes(raw)
    (meta / VERIFIED_LOG).unlink()
    marker = VerifiedMarker(repo_id=rev.repo_id, commit=rev.commit,
                            manifest_digest=result.manifest_digest,
                            algorithms=result.algorithms, files=result.files,
                            bytes=result.bytes)
    with open(meta / VERIFIED_NAME, "wb") as fh:
        fh.write(marker.model_dump_json(indent=2).encode())
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(meta)
    os.rename(partial, final)
    _fsync_dir(final.parent)
    return result
