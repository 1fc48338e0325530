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
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def exclusive(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on ``path``, waiting for it (``on_wait`` is told once)."""
    fd = _open(path)
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


def is_leased(path: Path) -> bool:
    """True while some live process holds a lease (a shared flock) on ``path``."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)


def take_lease(path: Path) -> int:
    """A shared flock on ``path``: returns the fd that holds it (inheritable, so that it stays
    held across exec by the command it guards)."""
    fd = _open(path)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.set_inheritable(fd, True)
    os.utime(path, (time.time(), time.time()))
    return fd
