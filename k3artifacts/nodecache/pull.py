"""``k3a pull``: put a release's weights under a node cache root, verified, atomically.

The order of work for one revision, under its exclusive lock (two pulls of one tuple on one
node: the second waits, then finds the first's complete copy):

1. the manifest is read from the weights' store and its digest held to the one the tuple
   binds: every later check trusts this manifest and nothing else;
2. a complete copy already here is hashed against it, every file, in this run (xxh3-128, one
   file per core: :mod:`.onhand`): if every file matches and nothing else is there, it is
   "already here"; otherwise it is moved back to its partial name, the files that matched
   kept. With ``verified_by_loader`` (the server loads with ``--load-format k3a`` and hashes
   every weights file as it reads it) the weights files are held to their kind and size only,
   and a file the loader refused (:mod:`.refusals`) counts as not matching;
3. files are planned: kept when a file at its final name in the partial directory hashes to
   the manifest in this run, hard-linked when another cached revision holds the same sha256
   and the linked bytes hash to the manifest in this run, else fetched (:mod:`.fetch`: ranged
   reads, each part hashed from the buffer it was written from, never read back; resumed
   part by part, a file whose resumed parts do not verify fetched again whole). The partial
   directory is this account's alone (0700; one owned by another account, or that others can
   write, is refused by name): no other account can open a file in it;
4. every file is re-checked: still the inode this run hashed (or wrote), untouched since
   (its ctime, which every write, chmod or utime moves): a change is an exit-4 refusal naming
   the files;
5. the partial directory gets the manifest and a verified marker, is made read-only and is
   renamed onto ``models/<org>/<name>/<commit>``: the revision appears complete or not at all.

Nothing on the disk is evidence (the root is a hostPath other pods can write): markers, part
records and file stats are never trusted in place of a hash. Nothing under the root is reached
through a link (:mod:`.safefs`); free space is checked before the first byte is fetched, and a
disk that fills anyway is an exit-8 refusal that keeps the partial revision for the re-run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts import faultpoints
from k3artifacts.errors import (
    ConfigError,
    Unavailable,
    UnsafeCacheEntry,
    VerifyMismatch,
)
from k3artifacts.nodecache import locks, refusals, safefs
from k3artifacts.nodecache.fetch import Fetcher, FileJob, Tuning, part_name
from k3artifacts.nodecache.layout import (
    VERIFIED_NAME,
    CacheLayout,
    Revision,
    VerifiedMarker,
    partial_name,
)
from k3artifacts.nodecache.onhand import (
    Check,
    Dirs,
    Identity,
    OnDisk,
    accept_for_loader,
    changed_after_hashing,
    hash_on_disk,
    split_path,
    still_as_hashed,
)
from k3artifacts.nodecache.safefs import Dir
from k3artifacts.revisions.manifest import (
    MANIFEST_NAME,
    META_DIR,
    FileRecord,
    ShardManifest,
)
from k3artifacts.revisions.refs import match_revision_ref
from k3artifacts.stores.base import Store
from k3artifacts.stores.registry import weights_store

#: The partial directory: this account's alone while files are written and hashed in it.
PARTIAL_MODE = 0o700


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
        where = weights_store(weights.location, weights.repo_id, weights.commit, beside=store)
    except ConfigError as exc:
        raise ConfigError(f"tuple {release.id}: {exc}") from None
    return PullTarget(Revision(weights.repo_id, weights.commit), weights.manifest_digest,
                      release.id, where)


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
    #: Bytes hard-linked from other cached revisions (same sha256, hashed in this run).
    bytes_reused: int = 0
    #: Bytes found in this revision's copy or partial pull (whole files, and parts of files
    #: an interrupted run left), hashed in this run.
    bytes_resumed: int = 0
    #: Bytes already on this node hashed in this run before being kept or linked: for a
    #: revision already here, all of them.
    bytes_rehashed: int = 0
    #: Bytes fed to xxh3-128 in this run: those re-hashed, and each fetched file once (from
    #: the buffers it was written from; parts an interrupted run left, from the disk).
    bytes_hashed: int = 0
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
    are hashed (files already on disk) or land (fetched), ``note(text)`` for events worth a
    line."""

    planned: Callable[[int, int], None] = lambda total, already: None
    advance: Callable[[int], None] = lambda nbytes: None
    note: Callable[[str], None] = lambda text: None


@dataclass
class _Check:
    """A complete copy held to the manifest: the files that hashed to it in this run, and
    everything that is wrong."""

    good: dict[str, Identity] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    bytes: int = 0
    hashed: int = 0


def _check_copy(layout: CacheLayout, rev: Revision, manifest: ShardManifest, raw: bytes,
                observer: PullObserver, on_disk: Check) -> _Check:
    """Every file of the complete copy hashed against ``manifest`` (links anywhere refused);
    its ``.k3a`` must hold exactly this manifest's bytes and a marker naming its digest."""
    check = _Check()
    records = {r.path: r for r in manifest.files}
    seen: set[str] = set()
    to_hash: list[FileRecord] = []
    with layout.repo_dir(rev) as repo, repo.sub(rev.commit) as top:
        for _, _, rel, st in safefs.walk_files(top):
            if rel.startswith(META_DIR + "/"):
                continue
            record = records.get(rel)
            if record is None:
                check.problems.append(f"{rel}: not in the manifest")
                continue
            seen.add(rel)
            if st.st_size != record.size:
                check.problems.append(f"{rel}: {st.st_size} bytes, manifest says {record.size}")
            else:
                to_hash.append(record)
        check.problems += [f"{path}: missing" for path in sorted(set(records) - seen)]
        check.problems += _meta_problems(top, manifest, raw)
        dirs = Dirs(top, create=False)
        try:
            hashed = on_disk(dirs, to_hash, on_bytes=observer.advance)
        finally:
            dirs.close()
    check.good, check.bytes, check.hashed = hashed.good, hashed.bytes, hashed.hashed
    check.problems += [f"{rel}: {why}" for rel, why in sorted(hashed.bad.items())]
    return check


def _meta_problems(top: Dir, manifest: ShardManifest, raw: bytes) -> list[str]:
    where = f"{META_DIR}/"
    try:
        meta = top.sub(META_DIR)
    except FileNotFoundError:
        return [f"{where}: missing"]
    with meta:
        problems = [f"{where}{name}: not written by k3a pull" for name, _ in meta.entries()
                    if name not in (MANIFEST_NAME, VERIFIED_NAME)]
        if meta.read_bytes(MANIFEST_NAME) != raw:
            problems.append(f"{where}{MANIFEST_NAME}: not the manifest the store holds")
        try:
            marker = VerifiedMarker.model_validate_json(meta.read_bytes(VERIFIED_NAME) or b"")
        except ValueError:
            marker = None
        if marker is None or not manifest.answers_to(marker.manifest_digest):
            problems.append(f"{where}{VERIFIED_NAME}: missing or names another manifest")
    return problems


def _link_from(layout: CacheLayout, held: tuple[Revision, FileRecord], parent: Dir,
               name: str) -> bool:
    """Hard-link another revision's copy in (its bytes are hashed next, like any file found
    on disk)."""
    rev, record = held
    parts = split_path(record.path)
    try:
        with layout.repo_dir(rev) as repo, repo.walk([rev.commit, *parts[:-1]]) as src:
            st = src.lstat(parts[-1])
            if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != record.size:
                return False
            parent.link(src, parts[-1], name)
    except (FileNotFoundError, UnsafeCacheEntry, VerifyMismatch):
        return False  # gone meanwhile, not safe to reach, or a planted path: fetch it
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EMLINK, errno.EPERM):
            return False  # another file system, or links refused there: fetch it
        raise
    return True


def sha256_index(layout: CacheLayout, exclude: Revision) -> dict[str, tuple[Revision,
                                                                            FileRecord]]:
    """sha256 -> (revision, record) over every complete cached revision but ``exclude``: where
    a file's bytes may already be on this node. Only a hint: what is linked is hashed."""
    index: dict[str, tuple[Revision, FileRecord]] = {}
    for rev in layout.revisions():
        if rev == exclude:
            continue
        manifest = layout.manifest(rev)
        if manifest is None:
            continue
        for record in manifest.files:
            index.setdefault(record.sha256, (rev, record))
    return index


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
                "re-run `k3a pull`: files on disk and recorded parts are hashed and kept; "
                "`k3a cache list` lists the unfinished pull",
            ) from None
        raise Unavailable(
            f"pulling {rev} into {layout.root}: {where}{exc.strerror or exc}",
            hint="check the node cache's disk and permissions (and the store's, for a file "
            "store), then re-run `k3a pull`: files on disk are hashed and kept",
        ) from None


def pull(target: PullTarget, root: Path, *, tuning: Tuning | None = None,
         observer: PullObserver | None = None, verified_by_loader: bool = False) -> PullResult:
    """``verified_by_loader``: the server loads with ``--load-format k3a``, which hashes every
    file as it reads it; files already on the node are then kept on their kind and size (a
    link still refused), not re-hashed, except those the loader refused (:mod:`.refusals`),
    fetched again. Files fetched are hashed as they are written either way."""
    tuning = tuning or Tuning()
    observer = observer or PullObserver()
    layout = CacheLayout(root)
    rev = target.revision
    started = time.monotonic()
    with _disk_errors(layout, rev):
        with locks.exclusive(layout, rev, on_wait=lambda: observer.note(
                f"waiting for another pull of {rev}")):
            result = _pull_locked(target, layout, tuning, observer, verified_by_loader)
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
    manifest = ShardManifest.parse(
        raw, f"the manifest of {rev.repo_id}@{rev.commit} in {target.store.url}")
    if target.manifest_digest is not None and not manifest.answers_to(target.manifest_digest):
        raise VerifyMismatch(
            f"{rev} in {target.store.url}: manifest digest {manifest.digest()}, the tuple "
            f"{target.tuple_id} binds {target.manifest_digest}; nothing was pulled",
            hint="the store's manifest was replaced behind the tuple: do not serve it; "
            "investigate the store",
        )
    return raw, manifest


def _present(target: PullTarget, layout: CacheLayout, repo: Dir, manifest: ShardManifest,
             raw: bytes, observer: PullObserver, on_disk: Check) -> PullResult | _Check:
    """The complete copy, if all of it passes ``on_disk`` (every byte hashes to ``manifest``
    in this run, unless the loader is left to hash them); else it is moved back to its partial
    name and the check is returned (the files that passed are kept, not re-read)."""
    rev = target.revision
    st = repo.lstat(rev.commit)
    if st is None:
        return _Check()
    if not stat.S_ISDIR(st.st_mode):
        raise repo.refuse(rev.commit)
    check = _check_copy(layout, rev, manifest, raw, observer, on_disk)
    if not check.problems:
        return PullResult(str(rev), target.tuple_id, manifest.digest(),
                          str(layout.final_dir(rev)), len(manifest.files),
                          manifest.total_bytes, bytes_rehashed=check.hashed,
                          bytes_hashed=check.hashed,
                          files_kept=len(check.good), already_present=True,
                          algorithms=["xxh3-128"])
    shown = "; ".join(check.problems[:5]) + (
        f" (and {len(check.problems) - 5} more)" if len(check.problems) > 5 else "")
    if locks.is_leased(layout, rev):
        raise VerifyMismatch(
            f"{layout.final_dir(rev)} does not match the manifest: {shown}",
            hint="a server leases it: stop the server, then re-run `k3a pull` (it fetches "
            "those files again); do not serve this copy meanwhile")
    observer.note(f"{layout.final_dir(rev)} does not match the manifest: {shown}; "
                  "fetching those files again")
    safefs.remove_tree(repo, partial_name(rev.commit))
    with repo.sub(rev.commit) as top:
        safefs.make_writable(top)
    repo.replace(rev.commit, repo, partial_name(rev.commit))
    repo.fsync()
    return check


def _pull_locked(target: PullTarget, layout: CacheLayout, tuning: Tuning,
                 observer: PullObserver, verified_by_loader: bool) -> PullResult:
    rev = target.revision
    raw, manifest = _read_manifest(target)
    observer.planned(manifest.total_bytes, 0)
    refused = refusals.refused(layout, manifest.digest())
    for path, why in sorted(refused.items()):
        observer.note(f"{path}: the verified load refused it ({why}); fetching it again")
    on_disk = accept_for_loader(refused) if verified_by_loader else hash_on_disk
    with layout.repo_dir(rev, create=True) as repo:
        present = _present(target, layout, repo, manifest, raw, observer, on_disk)
        if isinstance(present, PullResult):
            refusals.clear(layout, manifest.digest(), set(refused))
            return present
        with repo.sub(partial_name(rev.commit), create=True, mode=PARTIAL_MODE) as partial:
            _own(partial)
            # A run killed after sealing (read-only) and before the rename left it so.
            safefs.make_writable(partial)
            os.fchmod(partial.fd, PARTIAL_MODE)
            result = _fill(target, layout, repo, partial, manifest, tuning, observer, present,
                           on_disk)
            _seal(rev, partial, manifest, raw, result)
        st = repo.lstat(rev.commit)
        if st is not None:  # planted while we pulled
            raise repo.refuse(rev.commit)
        repo.replace(partial_name(rev.commit), repo, rev.commit)
        repo.fsync()
    refusals.clear(layout, manifest.digest(), set(refused))
    return result


def _fill(target: PullTarget, layout: CacheLayout, repo: Dir, partial: Dir,
          manifest: ShardManifest, tuning: Tuning, observer: PullObserver, prior: _Check,
          on_disk: Check) -> PullResult:
    """Every manifest file verified into ``partial``: kept, hard-linked or fetched; each
    kept or linked file held to the manifest by ``on_disk`` in this run (``prior``: the
    complete copy's check, its files by the identity they had then)."""
    hashed = prior.good
    rev = target.revision
    result = PullResult(str(rev), target.tuple_id, manifest.digest(),
                        str(layout.final_dir(rev)), len(manifest.files), manifest.total_bytes)
    dirs = Dirs(partial, create=True)
    try:
        unchanged, lying = _sort_on_disk(dirs, manifest, hashed)
        kept = on_disk(dirs, lying, on_bytes=observer.advance)
        for rel, why in sorted(kept.bad.items()):
            observer.note(f"{partial.path / rel}: {why}; fetching it again")
            parent, name = dirs.parent_of(rel)
            parent.unlink(name)  # there, but not the manifest's bytes
        kept_paths = {r.path for r in unchanged} | set(kept.good)
        result.files_kept = len(kept_paths)
        result.bytes_resumed = sum(r.size for r in unchanged) + kept.bytes
        missing = [r for r in manifest.files if r.path not in kept_paths]
        candidates = _link_others(layout, rev, dirs, missing)
        linked_paths = {r.path for r, _ in candidates}
        # The linked files are hashed while the others are fetched: a node holding the last
        # commit pulls the next one in the longer of the two, not in their sum (at 8 GiB on
        # 16 cores, the 7.5 GB hashed before one 510 MB shard started to arrive).
        with ThreadPoolExecutor(1, thread_name_prefix="k3a-linked") as checker:
            checking = checker.submit(on_disk, dirs, [r for r, _ in candidates],
                                      on_bytes=observer.advance)
            fetched = _fetch(target, layout, repo, dirs,
                             [r for r in missing if r.path not in linked_paths], tuning,
                             observer, result)
            linked = _keep_linked(dirs, candidates, checking.result(), observer)
        result.files_linked = len(linked)
        result.bytes_reused = sum(r.size for r in linked)
        already = prior.hashed + kept.hashed + checking.result().hashed
        result.bytes_rehashed += already
        result.bytes_hashed += already
        if linked:
            observer.note(f"reused {len(linked)} file(s), {result.bytes_reused:,} bytes, from "
                          "other cached revisions (hard links, hashed in this run)")
        # Linked, but not the manifest's bytes: fetched after all.
        good = {r.path for r in linked}
        fetched |= _fetch(target, layout, repo, dirs,
                          [r for r, _ in candidates if r.path not in good], tuning, observer,
                          result)
        held = {r.path: hashed[r.path] for r in unchanged} | kept.good | {
            r.path: checking.result().good[r.path] for r in linked} | fetched
        _recheck(dirs, manifest, held)
    finally:
        dirs.close()
    return result


def _recheck(dirs: Dirs, manifest: ShardManifest, held: dict[str, Identity]) -> None:
    """Before the seal, every file is still what this run hashed: the same inode, untouched
    since (its ctime: a fetched file's as the fetch left it, after its own last write and
    rename). VerifyMismatch (exit 4) names the others; the partial revision is left unsealed."""
    changed = [record.path for record in manifest.files
               if not still_as_hashed(dirs.lstat(record.path), held.get(record.path))]
    if changed:
        raise changed_after_hashing(changed)


def _own(partial: Dir) -> None:
    """The partial directory must be this account's, and no one else's to write: what the
    fetch writes in it and then hashes from memory is not read back."""
    st = os.fstat(partial.fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
        owner = f"another account's (uid {st.st_uid})" if st.st_uid != os.geteuid() else \
            f"writable by others (mode {stat.S_IMODE(st.st_mode):o})"
        raise UnsafeCacheEntry(
            f"{partial.path} is {owner}; k3a pulls only into a directory this account alone "
            "can write, and wrote nothing there",
            hint=f"remove {partial.path} (as its owner or root), then re-run `k3a pull`")


def _sort_on_disk(dirs: Dirs, manifest: ShardManifest, hashed: dict[str, Identity]
                  ) -> tuple[list[FileRecord], list[FileRecord]]:
    """(files this run already hashed and still as they were then, other files at their final
    name: to hash); absent files are in neither."""
    unchanged, on_disk = [], []
    for record in manifest.files:
        parent, name = dirs.parent_of(record.path)
        st = parent.lstat(name)
        if st is None:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise parent.refuse(name)
        if still_as_hashed(st, hashed.get(record.path)):
            unchanged.append(record)
        else:
            on_disk.append(record)
    return unchanged, on_disk


def _link_others(layout: CacheLayout, rev: Revision, dirs: Dirs, missing: list[FileRecord]
                 ) -> list[tuple[FileRecord, Revision]]:
    """Files another cached revision holds (same sha256 and size), hard-linked in, with the
    revision each came from: to be hashed before they are kept (:func:`_keep_linked`)."""
    if not missing:
        return []
    index = sha256_index(layout, rev)
    linked = []
    for record in missing:
        held = index.get(record.sha256)
        if held is None or held[1].size != record.size:
            continue
        parent, name = dirs.parent_of(record.path)
        parent.unlink(name)
        if _link_from(layout, held, parent, name):
            linked.append((record, held[0]))
    return linked


def _keep_linked(dirs: Dirs, linked: list[tuple[FileRecord, Revision]], checked: OnDisk,
                 observer: PullObserver) -> list[FileRecord]:
    """The linked files whose bytes hashed to their records in ``checked``; the others are
    unlinked again (and fetched)."""
    for record, source in linked:
        if record.path in checked.bad:
            observer.note(f"{record.path} in cached revision {source}: its bytes do not "
                          f"match ({checked.bad[record.path]}); not reused, fetching it")
            parent, name = dirs.parent_of(record.path)
            parent.unlink(name)
    return [r for r, _ in linked if r.path in checked.good]


def _fetch(target: PullTarget, layout: CacheLayout, repo: Dir, dirs: Dirs,
           to_fetch: list[FileRecord], tuning: Tuning, observer: PullObserver,
           result: PullResult) -> dict[str, Identity]:
    """Fetch ``to_fetch``: each file as its fetch left it at its final name."""
    if not to_fetch:
        result.algorithms = result.algorithms or ["xxh3-128"]
        return {}
    rev = target.revision
    places = [(record, *dirs.parent_of(record.path)) for record in to_fetch]
    _check_space(layout, repo, _still_needed(places))
    faultpoints.pause("pull-planned", str(rev))
    source = target.store.open_ranges(rev.repo_id, rev.commit, tuning.pool_connections)
    try:
        fetcher = Fetcher(source, tuning, on_bytes=observer.advance, on_note=observer.note)
        jobs: list[FileJob] = []
        try:
            for record, parent, name in places:
                jobs.append(fetcher.job(record, parent, name,
                                        source.checksums.get(record.path, {}).get("crc64nvme")))
        except BaseException:
            for job in jobs:
                job.close()
            raise
        # Parts an earlier run left are hashed with their file, not reported as they are.
        observer.advance(sum(j.resumed_bytes for j in jobs))
        totals = fetcher.run(jobs)
    finally:
        source.close()
    result.files_fetched += totals.files
    result.bytes_fetched += totals.bytes_fetched
    result.bytes_resumed += totals.bytes_resumed
    result.bytes_rehashed += totals.bytes_resumed
    result.bytes_hashed += totals.bytes_hashed
    result.algorithms = ["xxh3-128"] + (["crc64nvme"] if source.checksums else [])
    return totals.identities


def _still_needed(places: list[tuple[FileRecord, Dir, str]]) -> int:
    """Bytes the files to fetch will newly take (a part file kept from an earlier run
    already holds its space: it was preallocated)."""
    need = 0
    for record, parent, name in places:
        st = parent.lstat(part_name(name))
        held = st.st_blocks * 512 if st is not None and stat.S_ISREG(st.st_mode) else 0
        need += max(0, record.size - held)
    return need


def _seal(rev: Revision, partial: Dir, manifest: ShardManifest, raw: bytes,
          result: PullResult) -> None:
    """Exactly the manifest's files, the manifest and the marker written (and nothing else
    in ``.k3a``), everything read-only: ready to be renamed into view."""
    listed = {r.path for r in manifest.files}
    with partial.sub(META_DIR, create=True) as meta:
        for name, st in list(meta.entries()):
            if stat.S_ISDIR(st.st_mode):
                safefs.remove_tree(meta, name)
            else:
                meta.unlink(name)  # nothing but what is written next (a link there: refused)
    for parent, name, rel, _ in safefs.walk_files(partial):
        if rel not in listed and not rel.startswith(META_DIR + "/"):
            # A part file an earlier run left for a file this run hard-linked instead, a file
            # planted in the partial directory: the revision directory holds exactly the
            # manifest's files, or `k3a verify` refuses it.
            parent.unlink(name)
    with partial.sub(META_DIR) as meta:
        meta.write_file(MANIFEST_NAME, raw)
        marker = VerifiedMarker(repo_id=rev.repo_id, commit=rev.commit,
                                manifest_digest=result.manifest_digest,
                                algorithms=result.algorithms, files=result.files,
                                bytes=result.bytes)
        meta.write_file(VERIFIED_NAME, marker.model_dump_json(indent=2).encode())
        meta.fsync()
    safefs.set_read_only(partial)
    partial.fsync()
