"""What a node cache holds, and freeing it: least recently used first, never a leased one.

A revision is evicted under its exclusive revision lock (no pull of it is running) *and* an
exclusive lock on its lease file (no server holds a lease, and none can take one until the
revision is gone: ``k3a cache lease`` then finds it absent and says so). It is renamed to a
hidden name first, so readers see it whole or not at all, then deleted.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from k3artifacts.errors import Conflict, NotFound
from k3artifacts.nodecache import locks
from k3artifacts.nodecache.layout import CacheLayout, Revision


@dataclass(frozen=True)
class CachedRevision:
    revision: str
    path: str
    manifest_digest: str
    files: int
    bytes: int
    last_used: float
    leased: bool


def list_cached(layout: CacheLayout) -> list[CachedRevision]:
    """Most recently used first."""
    out = []
    for rev in layout.revisions():
        marker = layout.marker(rev)
        if marker is None:
            continue
        out.append(CachedRevision(str(rev), str(layout.final_dir(rev)), marker.manifest_digest,
                                  marker.files, marker.bytes, layout.last_used(rev),
                                  locks.is_leased(layout.lease_file(rev))))
    return sorted(out, key=lambda c: (-c.last_used, c.revision))


def _try_lock(path: Path) -> int | None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def evict(layout: CacheLayout, rev: Revision, *, locked: bool = False) -> bool:
    """Remove ``rev`` unless it is leased (False) or being pulled (Conflict). ``locked``: the
    caller already holds the revision lock."""
    rev_fd = None
    if not locked:
        rev_fd = _try_lock(layout.lock_file(rev))
        if rev_fd is None:
            raise Conflict(f"{rev} is being pulled right now", hint="retry when the pull ends")
    try:
        lease_fd = _try_lock(layout.lease_file(rev))
        if lease_fd is None:
            return False
        try:
            final = layout.final_dir(rev)
            if not final.exists():
                return True
            doomed = final.with_name(f".{final.name}.k3a-evicting")
            if doomed.exists():
                shutil.rmtree(doomed)
            os.rename(final, doomed)
            layout.used_file(rev).unlink(missing_ok=True)
            shutil.rmtree(doomed)
            return True
        finally:
            os.close(lease_fd)
    finally:
        if rev_fd is not None:
            os.close(rev_fd)


def remove(layout: CacheLayout, rev: Revision) -> None:
    if layout.marker(rev) is None and not layout.final_dir(rev).exists():
        raise NotFound(f"{rev} is not in the cache at {layout.root}",
                       hint="list what it holds with `k3a cache list`")
    if not evict(layout, rev):
        raise Conflict(f"{rev} is leased by a running server; not removed",
                       hint="stop the server (its lease goes with it), then remove")


@dataclass
class GcResult:
    kept: list[str]
    evicted: list[str]
    #: Would have been evicted but a server holds them.
    leased: list[str]


def gc(layout: CacheLayout, keep: int, protect: frozenset[str] = frozenset()) -> GcResult:
    """Keep the ``keep`` most recently used revisions (``protect`` is always kept and counts
    among them), evict the rest least recently used first, skipping leased ones."""
    cached = list_cached(layout)
    protected = [c for c in cached if c.revision in protect]
    others = [c for c in cached if c.revision not in protect]
    room = max(0, keep - len(protected))
    result = GcResult(kept=[c.revision for c in protected + others[:room]], evicted=[],
                      leased=[])
    for c in reversed(others[room:]):
        repo_id, _, commit = c.revision.rpartition("@")
        try:
            gone = evict(layout, Revision(repo_id, commit))
        except Conflict:
            gone = False
        (result.evicted if gone else result.leased).append(c.revision)
    return result
