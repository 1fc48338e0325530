"""What a rank saw of a file it read: the file's identity (device, inode, size, mtime, ctime),
the same before and after its read, so that the ranks of a node can prove they read one
unchanged file when only one of them hashed it (:func:`.share.agree` compares them).

Why an identity is enough: every change to a file's bytes moves its ctime to "now" (a write,
a truncate, a first write through a new writable mapping, a chmod or utime that would put the
mtime back), ctime cannot be set by any call, and a file put in its place is another inode.
Three cases escape that, each closed here:

- a change within the clock tick that stamped the file last (the identity would not move):
  a shared read only starts on a file whose ctime is :data:`SETTLED_NS` in the past, so any
  later change is stamped later;
- writes through a writable shared mapping made before the read (pages already dirty are
  written without a fault, so without a new ctime): a read lease, which the kernel grants
  only while nobody has the file open for writing, is taken and dropped around each read; a
  mapping holds its file open, so a refused lease is a refusal naming the file;
- a symbolic link planted at the file's name: opened with ``O_NOFOLLOW``; and the directory
  holding the files may not be writable by other accounts (who could put a file in place of
  one; caught by its inode anyway, refused before a byte is read).
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
import time
from pathlib import Path

from k3artifacts.errors import UnsafeCacheEntry, VerifyMismatch
from k3artifacts.nodecache.onhand import Identity

#: How long ago a file shared between ranks must last have changed: above the kernel's
#: coarse clock tick and the one-second timestamps of some filesystems.
SETTLED_NS = 2_000_000_000

_RESTORE = "restore the node's copy (`k3a pull` the tuple again) and restart the server; " \
    "nothing was served"


def check_directory(directory: Path) -> None:
    """Refuse a copy whose directory other accounts may write to."""
    mode = directory.stat().st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheEntry(
            f"{directory}: writable by other accounts (mode {stat.filemode(mode)}); anyone who "
            "can write there can put a file in place of one the server loads",
            hint=f"`k3a pull` the tuple again (it seals the copy read-only), or `chmod go-w "
            f"{directory}`, then restart the server")


def open_file(rel: str, path: os.PathLike) -> int:
    """A read-only descriptor of the file itself, never of what a link at its name points to."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeCacheEntry(f"{rel}: a symbolic link where the node's copy holds a "
                                   "file; k3a does not follow it") from None
        raise


def identity(fd: int) -> Identity:
    return Identity.of(os.fstat(fd))


def settled(fd: int, rel: str) -> Identity:
    """The file's identity once its ctime is :data:`SETTLED_NS` old (a file changed just now is
    waited for, at most that long), with nobody holding it open for writing."""
    seen = identity(fd)
    wait = seen.ctime_ns + SETTLED_NS - time.time_ns()
    if wait > SETTLED_NS:
        raise VerifyMismatch(f"{rel}: changed at ctime {seen.ctime_ns} ns, later than this "
                             "node's clock; k3a cannot tell a later change from it",
                             hint="fix the node's clock, then restart the server")
    if wait > 0:
        # Not synchronisation: the clock must pass the file's last stamp (see the module's doc).
        time.sleep(wait / 1e9)
        if identity(fd) != seen:
            raise changed(rel, "as the load began")
    no_writers(fd, rel)
    return seen


def no_writers(fd: int, rel: str) -> None:
    """Refuse if any process has the file open for writing (a writable mapping included).
    Where the kernel will not tell (leases off, or this account neither owns the file nor
    holds CAP_LEASE) this proves nothing: docs/guides/serving-and-node-cache.md says so."""
    try:
        # A lease broken in the moment it is held signals its holder; SIGURG is ignored by
        # default, where SIGIO would end the process.
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        if exc.errno == errno.EAGAIN:
            raise VerifyMismatch(f"{rel}: open for writing by another process on the node "
                                 "while the server loads it", hint=_RESTORE) from None
        return
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)


def unchanged(fd: int, rel: str, before: Identity, *, shared: bool) -> Identity:
    """The identity after a read, refused unless it is ``before``'s (and, ``shared``, unless the
    file is still open for writing nowhere)."""
    after = identity(fd)
    if after != before:
        raise changed(rel, "while this rank read it", before, after)
    if shared:
        no_writers(fd, rel)
    return after


def changed(rel: str, when: str, before: Identity | None = None,
            after: Identity | None = None) -> VerifyMismatch:
    seen = "" if before is None else f" ({describe(before)}, then {describe(after)})"
    return VerifyMismatch(f"{rel}: written or replaced on the node {when}{seen}",
                          hint=_RESTORE)


def describe(seen: Identity | None) -> str:
    if seen is None:
        return "not read"
    return (f"inode {seen.dev}:{seen.ino}, {seen.size} bytes, mtime {seen.mtime_ns}, "
            f"ctime {seen.ctime_ns}")
