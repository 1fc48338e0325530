"""flock-based locks: one pull or eviction of a revision at a time, and server leases.

flock rather than a pid file: the kernel drops the lock when its holder dies (kill -9, OOM, a
node reboot), so a crashed pull or server never leaves a revision locked or pinned for ever.
A lease is a *shared* flock on the revision's lease file: any number of servers hold one, and
eviction needs an exclusive one it only tries for. The file is compatible with util-linux
``flock -s FILE command``, so a serving image without k3a can hold a lease too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator

from k3artifacts.nodecache.layout import CacheLayout, Revision


@contextlib.contextmanager
def exclusive(layout: CacheLayout, rev: Revision,
              on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the revision's exclusive lock, waiting for it (``on_wait`` is told once)."""
    fd = layout.open_state("locks", rev, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def try_exclusive(layout: CacheLayout, kind: str, rev: Revision) -> int | None:
    """The fd holding an exclusive flock on the revision's lock or lease file, or None when
    another process holds one."""
    fd = layout.open_state(kind, rev, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def is_leased(layout: CacheLayout, rev: Revision) -> bool:
    """True while some live process holds a lease (a shared flock) on the revision."""
    try:
        fd = layout.open_state("leases", rev, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)


def take_lease(layout: CacheLayout, rev: Revision) -> int:
    """A shared flock on the revision's lease file: returns the fd that holds it
    (inheritable, so that it stays held across exec by the command it guards)."""
    fd = layout.open_state("leases", rev, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.set_inheritable(fd, True)
    os.utime(fd)
    return fd
