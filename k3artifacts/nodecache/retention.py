"""What a node cache holds, and freeing it: least recently used first, never a leased one.

A revision is evicted under its exclusive revision lock (no pull of it is running) *and* an
exclusive lock on its lease file (no server holds a lease, and none can take one until the
revision is gone: ``k3a cache lease`` then finds it absent and says so). It is renamed to a
hidden name first, so readers see it whole or not at all, then deleted.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from k3artifacts.errors import Conflict, NotFound
from k3artifacts.nodecache import locks, safefs
from k3artifacts.nodecache.layout import CacheLayout, Revision, partial_name


@dataclass(frozen=True)
class CachedRevision:
    revision: str
    path: str
    manifest_digest: str | None
    files: int
    bytes: int
    last_used: float
    leased: bool
    #: A pull started and did not finish (killed, or the disk filled): ``bytes`` is what it
    #: holds on disk; re-running the pull resumes it, ``k3a cache gc`` frees it.
    partial: bool = False


def _partial_bytes(layout: CacheLayout, rev: Revision) -> tuple[int, int]:
    try:
        with layout.repo_dir(rev) as repo, repo.sub(partial_name(rev.commit)) as top:
            sizes = [st.st_blocks * 512 for _, _, _, st in safefs.walk_files(top)]
    except FileNotFoundError:
        return 0, 0
    return len(sizes), sum(sizes)


def list_cached(layout: CacheLayout) -> list[CachedRevision]:
    """Most recently used first; partial pulls after the complete revisions."""
    out = []
    for rev in layout.revisions():
        marker = layout.marker(rev)
        if marker is None:
            continue
        out.append(CachedRevision(str(rev), str(layout.final_dir(rev)), marker.manifest_digest,
                                  marker.files, marker.bytes, layout.last_used(rev),
                                  locks.is_leased(layout, rev)))
    partials = []
    for rev in layout.partial_revisions():
        files, size = _partial_bytes(layout, rev)
        partials.append(CachedRevision(str(rev), str(layout.partial_dir(rev)), None, files,
                                       size, layout.last_used(rev), False, partial=True))
    return sorted(out, key=lambda c: (-c.last_used, c.revision)) + partials


def evict(layout: CacheLayout, rev: Revision, *, locked: bool = False) -> bool:
    """Remove ``rev`` unless it is leased (False) or being pulled (Conflict). ``locked``: the
    caller already holds the revision lock."""
    rev_fd = None
    if not locked:
        rev_fd = locks.try_exclusive(layout, "locks", rev)
        if rev_fd is None:
            raise Conflict(f"{rev} is being pulled right now", hint="retry when the pull ends")
    try:
        lease_fd = locks.try_exclusive(layout, "leases", rev)
        if lease_fd is None:
            return False
        try:
            try:
                repo = layout.repo_dir(rev)
            except FileNotFoundError:
                return True
            with repo:
                st = repo.lstat(rev.commit)
                if st is None:
                    return True
                if not stat.S_ISDIR(st.st_mode):
                    raise repo.refuse(rev.commit)
                doomed = f".{rev.commit}.k3a-evicting"
                safefs.remove_tree(repo, doomed)
                repo.replace(rev.commit, repo, doomed)
                used_kind, used_name = layout.state_file("used", rev)
                with layout.state_dir(used_kind) as used:
                    used.unlink(used_name)
                safefs.remove_tree(repo, doomed)
            return True
        finally:
            os.close(lease_fd)
    finally:
        if rev_fd is not None:
            os.close(rev_fd)


def drop_partial(layout: CacheLayout, rev: Revision) -> bool:
    """Delete an unfinished pull's directory unless a pull of it is running (False)."""
    rev_fd = locks.try_exclusive(layout, "locks", rev)
    if rev_fd is None:
        return False
    try:
        with layout.repo_dir(rev) as repo:
            safefs.remove_tree(repo, partial_name(rev.commit))
        return True
    except FileNotFoundError:
        return True
    finally:
        os.close(rev_fd)


def remove(layout: CacheLayout, rev: Revision) -> None:
    if layout.marker(rev) is None and not os.path.lexists(layout.final_dir(rev)):
        if rev in layout.partial_revisions():
            if not drop_partial(layout, rev):
                raise Conflict(f"{rev} is being pulled right now",
                               hint="retry when the pull ends")
            return
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
    #: Unfinished pulls deleted (none is running; a re-pull starts them afresh).
    partials: list[str] = field(default_factory=list)


def gc(layout: CacheLayout, keep: int, protect: frozenset[str] = frozenset()) -> GcResult:
    """Keep the ``keep`` most recently used revisions (``protect`` is always kept and counts
    among them), evict the rest least recently used first, skipping leased ones. Unfinished
    pulls no pull is running are deleted first: they hold space and serve nothing."""
    partials = [str(rev) for rev in layout.partial_revisions()
                if str(rev) not in protect and drop_partial(layout, rev)]
    cached = [c for c in list_cached(layout) if not c.partial]
    protected = [c for c in cached if c.revision in protect]
    others = [c for c in cached if c.revision not in protect]
    room = max(0, keep - len(protected))
    result = GcResult(kept=[c.revision for c in protected + others[:room]], evicted=[],
                      leased=[], partials=partials)
    for c in reversed(others[room:]):
        repo_id, _, commit = c.revision.rpartition("@")
        try:
            gone = evict(layout, Revision(repo_id, commit))
        except Conflict:
            gone = False
        (result.evicted if gone else result.leased).append(c.revision)
    return result
