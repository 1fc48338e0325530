"""Files already on this node, held to the manifest by hashing them in this run.

The cache root is writable by other pods, so what lies there is an input, never evidence: a
complete copy, a file an interrupted pull left at its final name, a file of another cached
revision with the same sha256. Each is kept (or hard-linked in) only if its bytes, read
through a link-safe descriptor, hash in this run to the xxh3-128 of the manifest the tuple
binds, all files at once (:func:`k3artifacts.revisions.parallel.hash_files`: one per core).
Records on disk (``verified.json``, part records, a file's size, mtime or inode) decide
nothing here.

Between this run's hash and the end of the pull a file is followed by its identity as it was
when hashed (device, inode, size, mtime, held in memory only): one swapped meanwhile is hashed
again, never kept on the strength of the earlier hash.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from k3artifacts.errors import VerifyMismatch
from k3artifacts.nodecache.safefs import Dir
from k3artifacts.revisions.manifest import META_DIR, FileRecord, is_weights
from k3artifacts.revisions.parallel import FileToHash, hash_files


@dataclass(frozen=True)
class Identity:
    """A file as it was when this run hashed it (never written anywhere). Its ctime is the
    kernel's, moved by every write, chmod and utime: whoever rewrites a byte and puts the
    mtime back still changes it."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def split_path(rel: str) -> list[str]:
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] == META_DIR:
        raise VerifyMismatch(f"{rel}: not a safe relative path; refusing to write it")
    return parts


class Dirs:
    """The directories of a revision tree, each opened once (link-safe) and kept open while
    files in them are hashed or written; ``create``: made where missing."""

    def __init__(self, top: Dir, *, create: bool):
        self.top = top
        self.create = create
        self.opened: dict[tuple[str, ...], Dir] = {(): top}

    def parent_of(self, rel: str) -> tuple[Dir, str]:
        parts = split_path(rel)
        key = tuple(parts[:-1])
        if key not in self.opened:
            self.opened[key] = self.top.walk(parts[:-1], create=self.create)
        return self.opened[key], parts[-1]

    def lstat(self, rel: str) -> os.stat_result | None:
        try:
            parent, name = self.parent_of(rel)
        except FileNotFoundError:
            return None
        return parent.lstat(name)

    def close(self) -> None:
        """Close what this opened (not ``top``: its caller's)."""
        for key, d in self.opened.items():
            if key:
                d.close()


@dataclass
class OnDisk:
    """Files whose bytes matched, with their identity when hashed; those that did not."""

    good: dict[str, Identity] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)
    bytes: int = 0
    #: Bytes read and hashed to decide (0 where the loader is left to hash them).
    hashed: int = 0


#: How files on disk are held to their records: :func:`hash_on_disk`, or
#: :func:`accept_for_loader`.
Check = Callable[..., OnDisk]


def hash_on_disk(dirs: Dirs, records: list[FileRecord], *,
                 on_bytes: Callable[[int], None] | None = None) -> OnDisk:
    """xxh3-128 of each record's file as it lies under ``dirs`` now, against the record.
    A link or special file at a record's path is refused (exit 9) before anything is read."""
    by_path = {r.path: r for r in records}
    seen: dict[str, Identity] = {}

    def opener(rel: str) -> Callable[[], int]:
        def open_file() -> int:
            parent, name = dirs.parent_of(rel)
            fd = parent.open_regular(name, os.O_RDONLY)
            seen[rel] = Identity.of(os.fstat(fd))
            return fd

        return open_file

    # Opened in the driving threads: each directory is opened here first, so that they only
    # read the table of open directories.
    for rel in by_path:
        with contextlib.suppress(FileNotFoundError):  # then the file is reported missing
            dirs.parent_of(rel)
    results = hash_files([FileToHash(r.path, r.size, opener(r.path)) for r in records],
                         "xxh3-128", on_bytes=on_bytes)
    out = OnDisk(hashed=sum(r.size for r in records))
    for rel, result in results.items():
        record = by_path[rel]
        if result.error is not None:
            out.bad[rel] = result.error
        elif result.size != record.size:
            out.bad[rel] = f"{result.size} bytes, manifest says {record.size}"
        elif result.digest != record.xxh3_128:
            out.bad[rel] = "xxh3-128 differs from the manifest"
        else:
            out.good[rel] = seen[rel]
            out.bytes += record.size
    return out


def accept_for_loader(refused: dict[str, str]) -> Check:
    """The check where the server hashes the weights as it loads them (``--load-format
    k3a``): each weights file (:func:`~k3artifacts.revisions.manifest.is_weights`), opened as
    :func:`hash_on_disk` opens it (a link refused), is kept when it is a regular file of the
    record's size and the loader has not refused it (``refused``: path -> the loader's reason,
    :mod:`.refusals`), its bytes not read here; every other file (config, tokenizer, index:
    small, and checked by no one else) is hashed by :func:`hash_on_disk`."""

    def check(dirs: Dirs, records: list[FileRecord], *,
              on_bytes: Callable[[int], None] | None = None) -> OnDisk:
        out = hash_on_disk(dirs, [r for r in records if not is_weights(r)], on_bytes=on_bytes)
        for record in filter(is_weights, records):
            try:
                parent, name = dirs.parent_of(record.path)
                fd = parent.open_regular(name, os.O_RDONLY)
            except FileNotFoundError:
                out.bad[record.path] = "missing"
                continue
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if record.path in refused:
                out.bad[record.path] = f"refused by the verified load: {refused[record.path]}"
            elif st.st_size != record.size:
                out.bad[record.path] = f"{st.st_size} bytes, manifest says {record.size}"
            else:
                out.good[record.path] = Identity.of(st)
                out.bytes += record.size
                if on_bytes is not None:
                    on_bytes(record.size)
        return out

    return check


def changed_after_hashing(paths: list[str]) -> VerifyMismatch:
    """The refusal (exit 4) for files that changed after this pull wrote or hashed them."""
    return VerifyMismatch(
        f"{', '.join(paths)}: changed in the node cache after this pull wrote or hashed "
        f"{'it' if len(paths) == 1 else 'them'}, before the revision was sealed; nothing was "
        "put at the final path",
        hint="something other than k3a writes the cache's directory as this account (a pod "
        "sharing its hostPath): find and stop it, then re-run `k3a pull`")


def still_as_hashed(st: os.stat_result | None, identity: Identity | None) -> bool:
    """The file at a path is still the one this run hashed there."""
    return (st is not None and identity is not None and stat.S_ISREG(st.st_mode)
            and Identity.of(st) == identity)
