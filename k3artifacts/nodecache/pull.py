"""``k3a pull``: put a release's weights under a node cache root, verified, atomically.

The order of work for one revision, under its exclusive lock (two pulls of one tuple on one
node: the second waits, then finds the first's complete copy):

1. the manifest is read from the weights' store and its digest held to the one the tuple
   binds: every later check trusts this manifest and nothing else;
2. files are planned: kept when an earlier, interrupted run verified them (its
   ``verified.jsonl``), hard-linked when another cached revision holds the same sha256, else
   fetched (:mod:`.fetch`: ranged reads, hashed as they arrive, resumed part by part);
3. the partial directory gets the manifest and a verified marker (with each file's size,
   mtime and inode), is made read-only and is renamed onto ``models/<org>/<name>/<commit>``:
   the revision appears complete or not at all.

A re-pull of a complete revision holds each file to that record (``--verify``: re-reads
it); a changed or swapped file is fetched again. Nothing under the root is reached through
a link (:mod:`.safefs`); free space is checked before the first byte is fetched, and a disk
that fills anyway is an exit-8 refusal that keeps the partial revision for the re-run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts import faultpoints
from k3artifacts.errors import (
    ConfigError,
    Conflict,
    Unavailable,
    UnsafeCacheEntry,
    VerifyMismatch,
)
from k3artifacts.nodecache import locks, safefs
from k3artifacts.nodecache.fetch import CHUNK, Fetcher, FileJob, Tuning, part_name
from k3artifacts.nodecache.layout import (
    VERIFIED_LOG,
    VERIFIED_NAME,
    CacheLayout,
    FileStat,
    Revision,
    VerifiedFile,
    VerifiedMarker,
    partial_name,
)
from k3artifacts.nodecache.retention import evict
from k3artifacts.nodecache.safefs import Dir
from k3artifacts.revisions.hashing import MultiHasher
from k3artifacts.revisions.manifest import (
    MANIFEST_NAME,
    META_DIR,
    FileRecord,
    ShardManifest,
)
from k3artifacts.revisions.refs import match_revision_ref
from k3artifacts.stores.base import Store
from k3artifacts.stores.registry import open_store, weights_placement


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
    # Tuples and channels bring their models (policy, rollout, history): a pull of a bare
    # revision, what a node does on every new commit, does not pay for importing them.
    from k3artifacts.releases.lookup import resolve_tuple

    release = resolve_tuple(store, name)
    weights = release.binding.weights
    try:
        url = weights_placement(weights.location, weights.repo_id, weights.commit).store_url
    except ConfigError as exc:
        raise ConfigError(f"tuple {release.id}: {exc}") from None
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


def _split(rel: str) -> list[str]:
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] == META_DIR:
        raise VerifyMismatch(f"{rel}: not a safe relative path; refusing to write it")
    return parts


class _Dirs:
    """The partial revision's directories, each opened once (link-safe) and kept open while
    the pull's jobs write into them."""

    def __init__(self, top: Dir):
        self.top = top
        self.opened: dict[tuple[str, ...], Dir] = {(): top}

    def parent_of(self, rel: str) -> tuple[Dir, str]:
        parts = _split(rel)
        key = tuple(parts[:-1])
        if key not in self.opened:
            self.opened[key] = self.top.walk(parts[:-1], create=True)
        return self.opened[key], parts[-1]

    def close(self) -> None:
        """Close what this opened (not ``top``: its caller's)."""
        for key, d in self.opened.items():
            if key:
                d.close()


def _read_verified_log(meta: Dir) -> dict[str, VerifiedFile]:
    found: dict[str, VerifiedFile] = {}
    raw = meta.read_bytes(VERIFIED_LOG)
    for line in (raw or b"").splitlines():
        try:
            entry = VerifiedFile.model_validate_json(line)
        except ValueError:
            continue  # a line torn by a crash: that file is simply checked again
        found[entry.path] = entry
    return found


def _matches(st: os.stat_result | None, want: FileStat | None) -> bool:
    """The file is still the one that was verified: same inode, size and mtime."""
    return (st is not None and want is not None and stat.S_ISREG(st.st_mode)
            and FileStat.of(st) == want)


def _hash_file(parent: Dir, name: str) -> str:
    """xxh3-128 of a file read through a no-follow descriptor, a chunk at a time."""
    hasher = MultiHasher(sha256=False, xxh3=True)
    buf = bytearray(CHUNK)
    fd = parent.open_regular(name, os.O_RDONLY)
    try:
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as fh:
            while n := fh.readinto(buf):
                hasher.update(memoryview(buf)[:n])
    finally:
        os.close(fd)
    return hasher.hexdigests().xxh3_128 or ""


@dataclass
class _Check:
    """A complete revision held to its manifest: files still as verified, and what is not."""

    good: dict[str, FileStat] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def check_revision(layout: CacheLayout, rev: Revision, manifest: ShardManifest,
                   marker: VerifiedMarker, *, full: bool) -> _Check:
    """Each file an ``lstat`` against the size, mtime and inode recorded when it was verified
    (``full``, or no record: its xxh3-128 re-read); links anywhere are refused."""
    check = _Check()
    records = {r.path: r for r in manifest.files}
    seen: set[str] = set()
    with layout.repo_dir(rev) as repo, repo.sub(rev.commit) as top:
        for parent, name, rel, st in safefs.walk_files(top):
            if rel.startswith(META_DIR + "/"):
                continue
            record = records.get(rel)
            if record is None:
                check.problems.append(f"{rel}: not in the manifest")
                continue
            seen.add(rel)
            recorded = marker.stats.get(rel)
            if st.st_size != record.size:
                check.problems.append(f"{rel}: {st.st_size} bytes, manifest says {record.size}")
            elif recorded is not None and not _matches(st, recorded):
                check.problems.append(f"{rel}: changed since it was verified (inode, size or "
                                      "mtime differ)")
            elif (full or recorded is None) and _hash_file(parent, name) != record.xxh3_128:
                check.problems.append(f"{rel}: xxh3-128 differs from the manifest")
            else:
                check.good[rel] = FileStat.of(st)
    check.problems += [f"{path}: missing" for path in sorted(set(records) - seen)]
    return check


def sha256_index(layout: CacheLayout, exclude: Revision
                 ) -> dict[str, tuple[Revision, FileRecord, FileStat]]:
    """sha256 -> (revision, record, verified stat) over every complete cached revision but
    ``exclude`` whose marker recorded the file's stat."""
    index: dict[str, tuple[Revision, FileRecord, FileStat]] = {}
    for rev in layout.revisions():
        if rev == exclude:
            continue
        manifest, marker = layout.manifest(rev), layout.marker(rev)
        if manifest is None or marker is None:
            continue
        for record in manifest.files:
            recorded = marker.stats.get(record.path)
            if recorded is not None:
                index.setdefault(record.sha256, (rev, record, recorded))
    return index


def _link_from(layout: CacheLayout, held: tuple[Revision, FileRecord, FileStat],
               parent: Dir, name: str) -> bool:
    """Hard-link another revision's copy in, if it is still the file verified there."""
    rev, record, recorded = held
    parts = _split(record.path)
    try:
        with layout.repo_dir(rev) as repo, repo.walk([rev.commit, *parts[:-1]]) as src:
            if not _matches(src.lstat(parts[-1]), recorded):
                return False
            parent.link(src, parts[-1], name)
    except (FileNotFoundError, UnsafeCacheEntry):
        return False  # gone meanwhile, or not safe to reach: fetch it
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EMLINK, errno.EPERM):
            return False  # another file system, or links refused there: fetch it
        raise
    if _matches(parent.lstat(name), recorded):
        return True
    parent.unlink(name)  # replaced between the check and the link
    return False


class _VerifiedLog:
    """Appends one line per verified file, synced: what a re-run keeps without re-reading."""

    def __init__(self, meta: Dir):
        self.fh = os.fdopen(meta.open(VERIFIED_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                            "ab")
        self.lock = threading.Lock()

    def add(self, record: FileRecord, st: os.stat_result) -> None:
        line = VerifiedFile(path=record.path, size=record.size, xxh3_128=record.xxh3_128,
                            stat=FileStat.of(st))
        with self.lock:
            self.fh.write(line.model_dump_json().encode() + b"\n")
            self.fh.flush()
            os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


def device_of(path: Path) -> str:
    """The file system holding ``path``, as ``df`` names it: its source and mount point."""
    try:
        dev = os.stat(path).st_dev
        want = f"{os.major(dev)}:{os.minor(dev)}"
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and fields[2] == want and " - " in line:
                    source = line.split(" - ", 1)[1].split()[1]
                    return f"{source} mounted at {fields[4]}"
    except OSError:
        pass
    return str(path)


def _check_space(layout: CacheLayout, repo: Dir, need: int) -> None:
    st = os.fstatvfs(repo.fd)
    have = st.f_bavail * st.f_frsize
    if need > have:
        raise Unavailable(
            f"not enough space in the node cache: need {_size(need)}, have {_size(have)} on "
            f"{device_of(layout.root)}; nothing was fetched",
            hint="free space (`k3a cache gc --keep N` evicts least recently used revisions) "
            "or point --to at a larger disk, then re-run",
        )


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB ({n:,} bytes)" if n >= 2**30 else f"{n:,} bytes"


@contextlib.contextmanager
def _disk_errors(layout: CacheLayout, rev: Revision) -> Iterator[None]:
    """A full disk (or another file-system error) is a refusal that says what to do, and
    leaves the partial revision where ``k3a cache list`` and ``k3a cache gc`` see it."""
    try:
        yield
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise Unavailable(
                f"the node cache's disk is full ({device_of(layout.root)}) while pulling "
                f"{rev}: {where}{exc.strerror}",
                hint="free space (`k3a cache gc --keep N`, or other files on that disk) and "
                "re-run `k3a pull`: verified files and recorded parts are kept and resumed; "
                "`k3a cache list` lists the unfinished pull",
            ) from None
        raise Unavailable(
            f"pulling {rev} into {layout.root}: {where}{exc.strerror or exc}",
            hint="check the node cache's disk and permissions (and the store's, for a file "
            "store), then re-run `k3a pull`: verified files are kept",
        ) from None


def pull(target: PullTarget, root: Path, *, tuning: Tuning | None = None,
         observer: PullObserver | None = None, verify: bool = False) -> PullResult:
    """``verify``: re-read every file of an already complete copy (xxh3-128) rather than
    holding each to the size, mtime and inode recorded when it was verified."""
    tuning = tuning or Tuning()
    observer = observer or PullObserver()
    layout = CacheLayout(root)
    rev = target.revision
    started = time.monotonic()
    with _disk_errors(layout, rev):
        with locks.exclusive(layout, rev, on_wait=lambda: observer.note(
                f"waiting for another pull of {rev}")):
            result = _pull_locked(target, layout, tuning, observer, verify)
        # The lease file exists before any server starts: `flock -s FILE` on a read-only
        # mount can then open it.
        os.close(layout.open_state("leases", rev, os.O_RDWR | os.O_CREAT))
        layout.touch_used(rev)
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _read_manifest(target: PullTarget) -> tuple[bytes, ShardManifest]:
    rev = target.revision
    raw = target.store.published_manifest_bytes(
        rev.repo_id, rev.commit,
        hint="check the tuple's store (--store) or stage the revision first")
    manifest = ShardManifest.parse(raw)
    if target.manifest_digest is not None and not manifest.answers_to(target.manifest_digest):
        raise VerifyMismatch(
            f"{rev} in {target.store.url}: manifest digest {manifest.digest()}, the tuple "
            f"{target.tuple_id} binds {target.manifest_digest}; nothing was pulled",
            hint="the store's manifest was replaced behind the tuple: do not serve it; "
            "investigate the store",
        )
    return raw, manifest


def _present(target: PullTarget, layout: CacheLayout, observer: PullObserver,
             verify: bool) -> PullResult | None:
    """The complete copy, if it is still what was verified; else it is turned back into a
    partial revision holding only its good files (the rest are fetched again)."""
    rev = target.revision
    marker = layout.marker(rev)
    if marker is None or target.manifest_digest not in (None, marker.manifest_digest):
        return None
    manifest = layout.manifest(rev)
    if manifest is None or manifest.digest() != marker.manifest_digest:
        check = _Check(problems=[f"{META_DIR}/{MANIFEST_NAME}: missing or not the verified "
                                 "manifest"])
    else:
        check = check_revision(layout, rev, manifest, marker, full=verify)
    if not check.problems:
        observer.planned(marker.bytes, marker.bytes)
        return PullResult(str(rev), target.tuple_id, marker.manifest_digest,
                          str(layout.final_dir(rev)), marker.files, marker.bytes,
                          already_present=True, algorithms=marker.algorithms)
    shown = "; ".join(check.problems[:5]) + (
        f" (and {len(check.problems) - 5} more)" if len(check.problems) > 5 else "")
    if locks.is_leased(layout, rev):
        raise VerifyMismatch(
            f"{layout.final_dir(rev)} no longer matches what was verified: {shown}",
            hint="a server leases it: stop the server, then re-run `k3a pull` (it fetches "
            "the changed files again); do not serve this copy meanwhile")
    observer.note(f"{layout.final_dir(rev)} no longer matches what was verified: {shown}; "
                  "fetching those files again")
    _reopen(layout, rev, check.good, manifest)
    return None


def _reopen(layout: CacheLayout, rev: Revision, good: dict[str, FileStat],
            manifest: ShardManifest | None) -> None:
    """Move a complete revision back to its partial name, its good files logged as kept."""
    records = {r.path: r for r in manifest.files} if manifest is not None else {}
    with layout.repo_dir(rev) as repo:
        safefs.remove_tree(repo, partial_name(rev.commit))
        with repo.sub(rev.commit) as top:
            safefs.make_writable(top)
            with top.sub(META_DIR, create=True) as meta:
                lines = [VerifiedFile(path=p, size=st.size, xxh3_128=records[p].xxh3_128,
                                      stat=st).model_dump_json()
                         for p, st in sorted(good.items()) if p in records]
                meta.write_file(VERIFIED_LOG, "".join(f"{x}\n" for x in lines).encode(),
                                mode=0o644)
                meta.unlink(VERIFIED_NAME)
                meta.unlink(MANIFEST_NAME)
        repo.replace(rev.commit, repo, partial_name(rev.commit))
        repo.fsync()


def _pull_locked(target: PullTarget, layout: CacheLayout, tuning: Tuning,
                 observer: PullObserver, verify: bool) -> PullResult:
    rev = target.revision
    final = layout.final_dir(rev)
    present = _present(target, layout, observer, verify)
    if present is not None:
        return present
    raw, manifest = _read_manifest(target)
    with layout.repo_dir(rev, create=True) as repo:
        st = repo.lstat(rev.commit)
        if st is not None:
            if not stat.S_ISDIR(st.st_mode):
                raise repo.refuse(rev.commit)
            # The same commit with another manifest (or no marker): not what the tuple binds.
            observer.note(f"{final} holds another copy of {rev}; replacing it")
            if not evict(layout, rev, locked=True):
                raise Conflict(f"{final} holds a different copy of {rev} and a server leases "
                               "it", hint="stop the server using it, then pull again")
        with repo.sub(partial_name(rev.commit), create=True) as partial:
            # A run killed after sealing (read-only) and before the rename left it so.
            safefs.make_writable(partial)
            result = _fill(target, layout, repo, partial, manifest, tuning, observer)
            _seal(rev, partial, manifest, raw, result)
        st = repo.lstat(rev.commit)
        if st is not None:  # planted while we pulled
            raise repo.refuse(rev.commit)
        repo.replace(partial_name(rev.commit), repo, rev.commit)
        repo.fsync()
    return result


def _fill(target: PullTarget, layout: CacheLayout, repo: Dir, partial: Dir,
          manifest: ShardManifest, tuning: Tuning, observer: PullObserver) -> PullResult:
    """Every manifest file verified into ``partial``: kept, hard-linked or fetched."""
    rev = target.revision
    result = PullResult(str(rev), target.tuple_id, manifest.digest(),
                        str(layout.final_dir(rev)), len(manifest.files), manifest.total_bytes)
    dirs = _Dirs(partial)
    meta = partial.sub(META_DIR, create=True)
    dirs.opened[(META_DIR,)] = meta
    try:
        verified = _read_verified_log(meta)
        vlog = _VerifiedLog(meta)
        source = target.store.open_ranges(rev.repo_id, rev.commit, tuning.pool_connections)
        try:
            index: dict[str, tuple[Revision, FileRecord, FileStat]] | None = None
            to_fetch: list[tuple[FileRecord, Dir, str]] = []
            for record in manifest.files:
                parent, name = dirs.parent_of(record.path)
                done = verified.get(record.path)
                if (done is not None and done.size == record.size
                        and done.xxh3_128 == record.xxh3_128
                        and _matches(parent.lstat(name), done.stat)):
                    result.files_kept += 1
                    result.bytes_resumed += record.size
                    continue
                parent.unlink(name)  # there but never verified: not trusted
                if index is None:
                    index = sha256_index(layout, rev)
                held = index.get(record.sha256)
                if held is not None and held[1].size == record.size \
                        and held[1].xxh3_128 == record.xxh3_128 \
                        and _link_from(layout, held, parent, name):
                    vlog.add(record, parent.lstat(name))
                    result.files_linked += 1
                    result.bytes_reused += record.size
                    continue
                to_fetch.append((record, parent, name))
            _check_space(layout, repo, _still_needed(to_fetch))
            faultpoints.pause("pull-planned", str(rev))
            fetcher = Fetcher(source, tuning, on_bytes=observer.advance,
                              on_verified=lambda job: vlog.add(job.record, job.stat))
            jobs: list[FileJob] = []
            try:
                for record, parent, name in to_fetch:
                    jobs.append(fetcher.job(record, parent, name,
                                            source.checksums.get(record.path, {})
                                            .get("crc64nvme")))
            except BaseException:
                for job in jobs:
                    job.close()
                raise
            resumed = sum(j.resumed_bytes for j in jobs)
            observer.planned(manifest.total_bytes,
                             result.bytes_resumed + result.bytes_reused + resumed)
            if result.files_linked:
                observer.note(f"reused {result.files_linked} file(s), {result.bytes_reused:,} "
                              "bytes, from other cached revisions (hard links)")
            totals = fetcher.run(jobs)
        finally:
            vlog.close()
            source.close()
    finally:
        dirs.close()
    result.files_fetched = totals.files
    result.bytes_fetched = totals.bytes_fetched
    result.bytes_resumed += totals.bytes_resumed
    result.algorithms = ["xxh3-128"] + (["crc64nvme"] if source.checksums else [])
    return result


def _still_needed(to_fetch: list[tuple[FileRecord, Dir, str]]) -> int:
    """Bytes the files to fetch will newly take (a part file kept from an earlier run
    already holds its space: it was preallocated)."""
    need = 0
    for record, parent, name in to_fetch:
        st = parent.lstat(part_name(name))
        held = st.st_blocks * 512 if st is not None and stat.S_ISREG(st.st_mode) else 0
        need += max(0, record.size - held)
    return need


def _seal(rev: Revision, partial: Dir, manifest: ShardManifest, raw: bytes,
          result: PullResult) -> None:
    """Exactly the manifest's files, their stats recorded, the manifest and the marker
    written, everything read-only: ready to be renamed into view."""
    listed = {r.path for r in manifest.files}
    stats: dict[str, FileStat] = {}
    for parent, name, rel, st in safefs.walk_files(partial):
        if rel.startswith(META_DIR + "/"):
            continue
        if rel in listed:
            stats[rel] = FileStat.of(st)
        else:
            # A part file an earlier run left for a file this run hard-linked instead: the
            # revision directory must hold exactly the manifest's files, or `k3a verify`
            # refuses it.
            parent.unlink(name)
    with partial.sub(META_DIR) as meta:
        meta.write_file(MANIFEST_NAME, raw)
        marker = VerifiedMarker(repo_id=rev.repo_id, commit=rev.commit,
                                manifest_digest=result.manifest_digest,
                                algorithms=result.algorithms, files=result.files,
                                bytes=result.bytes, stats=stats)
        meta.write_file(VERIFIED_NAME, marker.model_dump_json(indent=2).encode())
        # Last: a disk that fills before this leaves the log a re-run keeps files by.
        meta.unlink(VERIFIED_LOG)
        meta.fsync()
    safefs.set_read_only(partial)
    partial.fsync()
