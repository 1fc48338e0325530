"""A warm artifact on a node: pulled into the node cache verified, and at use copied, verified
again, into the directories the server compiles into.

```
ROOT/warm/<tuple-id>/<gpu-slug>/<layout>/<cache>/<path>     files, read-only
ROOT/warm/<tuple-id>/<gpu-slug>/<layout>/.k3a/manifest.json  the manifest (as stored)
ROOT/warm/<tuple-id>/<gpu-slug>/<layout>/.k3a/verified.json  what was verified (WarmMarker)
ROOT/warm/<tuple-id>/<gpu-slug>/.<layout>.k3a-partial/      a pull in progress
```

Everything under ROOT is reached through :mod:`k3artifacts.nodecache.safefs` (directory
descriptors, ``O_NOFOLLOW``; a planted link is refused, never followed). A directory k3a
removes here goes however deep it nests (:func:`~k3artifacts.nodecache.safefs.remove_any_depth`):
a partial pull left by an older k3a, or planted by another pod, never blocks a later pull, and
``k3a cache ls`` lists and ``k3a cache gc`` removes every partial pull no running pull holds.
A pull assembles the artifact in its partial directory, each file's sha256 and xxh3-128 checked
as its bytes arrive, and renames it into place only when complete. A use re-reads every file of
that copy while writing it into the server's cache directory (xxh3-128, one read): a file
changed on the node after the pull is a miss at use, and what was copied is removed before the
server starts. The server's directories are writable copies, never the cache's read-only files:
the server adds what it compiles that the artifact did not hold.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import K3AError, NotFound, UnsafeCacheEntry
from k3artifacts.nodecache import locks, safefs
from k3artifacts.nodecache.layout import CacheLayout, Revision
from k3artifacts.nodecache.safefs import Dir, remove_any_depth
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.revisions.hashing import MultiHasher
from k3artifacts.revisions.manifest import META_DIR
from k3artifacts.stores.base import Store
from k3artifacts.warm.model import CACHE_ROOTS, WarmFile, WarmManifest, gpu_slug
from k3artifacts.warm.trust import Trusted, WarmMiss

WARM_DIR = "warm"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
MARKER = "verified.json"
PARTIAL_SUFFIX = ".k3a-partial"
WORKERS = 16
CHUNK = 1 << 20


class WarmMarker(BaseModel):
    """``.k3a/verified.json`` of a pulled warm artifact."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tuple_id: str
    #: The weights the tuple binds: the artifact is evicted with them.
    repo_id: str
    commit: str
    gpu: str
    layout: str
    manifest_digest: str
    files: int
    bytes: int
    signed_by: str | None = None


def _parts(release_id: str, gpu: str) -> list[str]:
    return [WARM_DIR, release_id, gpu_slug(gpu)]


def artifact_dir(root: Path, tuple_id: str, gpu: str, layout: str) -> Path:
    return Path(root).absolute().joinpath(*_parts(tuple_id, gpu), layout)


def _lock_rev(tuple_id: str, gpu: str, layout: str) -> Revision:
    # The node cache's flock files are per "revision" name; a warm artifact takes its own.
    return Revision(f"{WARM_DIR}/{tuple_id}", f"{gpu_slug(gpu)}+{layout}")


class _Tree:
    """Directories under one top, each opened once (link-safe), shared by worker threads."""

    def __init__(self, top: Dir):
        self.top = top
        self.opened: dict[tuple[str, ...], Dir] = {}
        self.lock = threading.Lock()

    def parent_of(self, parts: list[str]) -> Dir:
        key = tuple(parts[:-1])
        with self.lock:
            if key not in self.opened:
                self.opened[key] = self.top.walk(list(key), create=True)
            return self.opened[key]

    def close(self) -> None:
        for d in self.opened.values():
            d.close()


def _file_parts(f: WarmFile) -> list[str]:
    return [f.root, *f.path.split("/")]


@dataclass
class WarmPullResult:
    tuple_id: str
    gpu: str
    layout: str
    path: str
    manifest_digest: str
    files: int
    bytes: int
    already_present: bool = False
    signed_by: str | None = None


def read_marker(root: Path, tuple_id: str, gpu: str, layout: str) -> WarmMarker | None:
    try:
        with safefs.open_root(Path(root), create=False) as top, \
                top.walk([*_parts(tuple_id, gpu), layout, META_DIR]) as meta:
            raw = meta.read_bytes(MARKER)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return None if raw is None else WarmMarker.model_validate_json(raw)
    except ValueError:
        return None


def pull_warm(store: Store, release: ReleaseTuple, trusted: Trusted, root: Path,
              *, workers: int = WORKERS) -> WarmPullResult:
    """Bring a trusted artifact's files into the node cache, each checked as it arrives;
    WarmMiss("corrupt") when a blob is missing or does not match (nothing is left behind)."""
    m = trusted.manifest
    layout = CacheLayout(root)
    result = WarmPullResult(m.tuple_id, m.gpu, m.layout,
                            str(artifact_dir(root, m.tuple_id, m.gpu, m.layout)),
                            trusted.digest, len(m.files), m.total_bytes,
                            signed_by=trusted.signed_by)
    with locks.exclusive(layout, _lock_rev(m.tuple_id, m.gpu, m.layout)):
        marker = read_marker(root, m.tuple_id, m.gpu, m.layout)
        if marker is not None and marker.manifest_digest == trusted.digest:
            result.already_present = True
            return result
        with safefs.open_root(Path(root)) as top, top.walk(_parts(m.tuple_id, m.gpu),
                                                           create=True) as parent:
            remove_any_depth(parent, m.layout)  # another (or an unverified) copy
            partial = f".{m.layout}{PARTIAL_SUFFIX}"
            remove_any_depth(parent, partial)  # an interrupted pull: its files are unproven
            with parent.sub(partial, create=True) as work:
                try:
                    _fetch_all(store, m, work, workers)
                    w = release.binding.weights
                    with work.sub(META_DIR, create=True) as meta:
                        meta.write_file(MANIFEST, trusted.raw)
                        if trusted.signature is not None:
                            meta.write_file(SIGNATURE, trusted.signature)
                        meta.write_file(MARKER, WarmMarker(
                            tuple_id=m.tuple_id, repo_id=w.repo_id, commit=w.commit, gpu=m.gpu,
                            layout=m.layout, manifest_digest=trusted.digest,
                            files=len(m.files), bytes=m.total_bytes,
                            signed_by=trusted.signed_by).model_dump_json(indent=2).encode())
                    safefs.set_read_only(work)
                except BaseException:
                    remove_any_depth(parent, partial)
                    raise
            parent.replace(partial, parent, m.layout)
            parent.fsync()
    return result


def _fetch_all(store: Store, m: WarmManifest, work: Dir, workers: int) -> None:
    tree = _Tree(work)

    def one(f: WarmFile) -> None:
        parts = _file_parts(f)
        parent = tree.parent_of(parts)
        hasher = MultiHasher()
        fd = parent.create_new(parts[-1], 0o755 if f.executable else 0o644)
        try:
            try:
                src = store.open_read(f.blob_key)
            except NotFound:
                raise WarmMiss("corrupt", f"{f.root}/{f.path}: blob {f.sha256[:16]}... is "
                               "missing from the store") from None
            with src:
                while chunk := src.read(CHUNK):
                    hasher.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        d = hasher.hexdigests()
        if d.size != f.size or d.sha256 != f.sha256 or d.xxh3_128 != f.xxh3_128:
            raise WarmMiss("corrupt", f"{f.root}/{f.path}: the store's blob does not match the "
                           "manifest (size or sha256/xxh3-128)")

    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="warm-pull") as pool:
            for future in [pool.submit(one, f) for f in m.files]:
                future.result()
    finally:
        tree.close()


@dataclass
class WarmUse:
    used: bool
    reason: str | None
    detail: str | None
    files: int = 0
    bytes: int = 0
    #: Variable -> directory, for every cache root set up (empty when cold).
    env: dict[str, str] | None = None


def _fresh(dest: Dir, name: str) -> None:
    """An empty directory ``name`` in the server's working directory, whatever was there: a
    link planted in its place is removed as a link (never followed), a tree emptied."""
    st = dest.lstat(name)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dest.fd)
    else:
        remove_any_depth(dest, name)
    dest.sub(name, create=True).close()


def use_cold(into: Path) -> dict[str, str]:
    """Empty cache directories under ``into``: the server compiles cold."""
    with safefs.open_root(Path(into)) as dest:
        for name in CACHE_ROOTS:
            _fresh(dest, name)
    return {var: str(Path(into) / name) for name, var in CACHE_ROOTS.items()}


def use_warm(root: Path, trusted: Trusted, into: Path) -> WarmUse:
    """Copy the pulled artifact into ``into/<cache>/`` (writable), re-verifying every byte;
    a miss (not pulled, another digest, a changed file, a link) leaves ``into`` holding
    empty cache directories: the server compiles cold."""
    m = trusted.manifest
    env = {CACHE_ROOTS[name]: str(Path(into) / name) for name in CACHE_ROOTS}
    with safefs.open_root(Path(into)) as dest:
        for name in CACHE_ROOTS:  # whatever an earlier server left: not verified, not used
            _fresh(dest, name)
        try:
            marker = read_marker(root, m.tuple_id, m.gpu, m.layout)
            if marker is None or marker.manifest_digest != trusted.digest:
                raise WarmMiss("not-pulled", f"{artifact_dir(root, m.tuple_id, m.gpu, m.layout)}"
                               " holds no verified copy of this artifact (k3a pull brings it)")
            with safefs.open_root(Path(root), create=False) as top, \
                    top.walk([*_parts(m.tuple_id, m.gpu), m.layout]) as src:
                _copy_verified(src, dest, m)
        except (WarmMiss, UnsafeCacheEntry, FileNotFoundError) as exc:
            for name in CACHE_ROOTS:
                _fresh(dest, name)
            if isinstance(exc, WarmMiss):
                return WarmUse(False, exc.reason, exc.detail, env=env)
            reason = "unsafe" if isinstance(exc, K3AError) else "not-pulled"
            return WarmUse(False, reason, str(exc), env=env)
    return WarmUse(True, None, None, len(m.files), m.total_bytes, env=env)


def _copy_verified(src: Dir, dest: Dir, m: WarmManifest) -> None:
    sources, targets = _Tree(src), _Tree(dest)

    def one(f: WarmFile) -> None:
        parts = _file_parts(f)
        sparent, tparent = sources.parent_of(parts), targets.parent_of(parts)
        hasher = MultiHasher(sha256=False)
        rfd = sparent.open_regular(parts[-1], os.O_RDONLY)
        try:
            wfd = tparent.create_new(parts[-1], 0o755 if f.executable else 0o644)
            try:
                while chunk := os.read(rfd, CHUNK):
                    hasher.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(wfd, view):]
            finally:
                os.close(wfd)
        finally:
            os.close(rfd)
        d = hasher.hexdigests()
        if d.size != f.size or d.xxh3_128 != f.xxh3_128:
            raise WarmMiss("corrupt", f"{f.root}/{f.path}: changed on this node since it was "
                           "pulled (xxh3-128 differs from the manifest)")

    try:
        with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="warm-use") as pool:
            for future in [pool.submit(one, f) for f in m.files]:
                future.result()
    finally:
        sources.close()
        targets.close()


@dataclass(frozen=True)
class CachedWarm:
    tuple_id: str
    gpu: str
    layout: str
    path: str
    revision: str
    files: int
    bytes: int
    #: A pull that did not finish (killed, or refused midway): nothing uses it, ``k3a cache
    #: gc`` removes it; ``revision`` is unknown and ``files``/``bytes`` count what is there.
    partial: bool = False


def _partial_size(gdir: Dir, name: str) -> tuple[int, int]:
    """Files and bytes of a partial pull, as far as a bounded walk reaches (a tree deeper than
    the walk allows is still listed, and removed by gc)."""
    files = size = 0
    try:
        with gdir.sub(name) as top:
            for _, _, _, st in safefs.walk_files(top):
                files, size = files + 1, size + st.st_blocks * 512
    except (UnsafeCacheEntry, OSError):
        pass
    return files, size


def _layouts(root: Path) -> Iterator[tuple[str, str, Dir]]:
    """(tuple id, gpu slug, its directory) under ROOT/warm (a link on the way is refused)."""
    try:
        top = safefs.open_root(Path(root), create=False)
    except FileNotFoundError:
        return
    with top:
        if top.lstat(WARM_DIR) is None:
            return
        with top.sub(WARM_DIR) as warm:
            for tuple_id, st in sorted(warm.entries()):
                if not stat.S_ISDIR(st.st_mode):
                    raise warm.refuse(tuple_id)
                with warm.sub(tuple_id) as tdir:
                    for gpu, gst in sorted(tdir.entries()):
                        if not stat.S_ISDIR(gst.st_mode):
                            raise tdir.refuse(gpu)
                        with tdir.sub(gpu) as gdir:
                            yield tuple_id, gpu, gdir


def list_warm(root: Path) -> list[CachedWarm]:
    """Every pulled warm artifact under ``root``, then every partial pull."""
    out: list[CachedWarm] = []
    partials: list[CachedWarm] = []
    for tuple_id, gpu, gdir in _layouts(root):
        for lay, lst in sorted(gdir.entries()):
            if lay.startswith(".") and lay.endswith(PARTIAL_SUFFIX):
                layout = lay[1:-len(PARTIAL_SUFFIX)]
                files, size = _partial_size(gdir, lay)
                partials.append(CachedWarm(tuple_id, gpu, layout, str(gdir.path / lay), "",
                                           files, size, partial=True))
                continue
            if lay.startswith(".") or not stat.S_ISDIR(lst.st_mode):
                continue
            marker = read_marker(root, tuple_id, gpu, lay)
            if marker is not None:
                out.append(CachedWarm(
                    tuple_id, marker.gpu, lay, str(artifact_dir(root, tuple_id, gpu, lay)),
                    f"{marker.repo_id}@{marker.commit}", marker.files, marker.bytes))
    return out + partials


def drop_warm(root: Path, keep_revisions: set[str]) -> list[str]:
    """Remove every pulled warm artifact whose tuple's weights are not among
    ``keep_revisions`` (``org/name@commit``): a warm artifact lives as long as its weights on
    the node. Returns the paths removed."""
    removed = []
    for cached in list_warm(root):
        if cached.partial or cached.revision in keep_revisions:
            continue
        with safefs.open_root(Path(root), create=False) as top, \
                top.walk(_parts(cached.tuple_id, cached.gpu)) as parent:
            remove_any_depth(parent, cached.layout)
        removed.append(cached.path)
    return removed


def drop_warm_partials(root: Path) -> list[str]:
    """Remove every partial warm pull that no running pull holds; returns the paths removed."""
    layout = CacheLayout(root)
    removed = []
    for cached in list_warm(root):
        if not cached.partial:
            continue
        held = locks.try_exclusive(layout, "locks",
                                   _lock_rev(cached.tuple_id, cached.gpu, cached.layout))
        if held is None:
            continue  # a pull is filling it right now
        try:
            with safefs.open_root(Path(root), create=False) as top, \
                    top.walk([WARM_DIR, cached.tuple_id, cached.gpu]) as parent:
                remove_any_depth(parent, f".{cached.layout}{PARTIAL_SUFFIX}")
        finally:
            os.close(held)
        removed.append(cached.path)
    return removed
