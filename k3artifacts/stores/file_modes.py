"""Who may read and write what a file store writes: one account's store, or a team's.

A file store is a team's when its root directory is set-group-ID (``k3a bootstrap
file:///PATH --group GROUP`` makes it so: ``stores/file_bootstrap.py``). Then, as with git's
``core.sharedRepository=group``, the store gives its group what the team needs whatever each
member's umask says, and no more:

* records and pointers are read-only files: the owner and the group read them; others read
  them only if the writer's umask lets others read. A record is never changed in place (a
  pointer is replaced by renaming a new file over it), so nobody needs to write one;
* a directory the store makes for records is group-writable (so another member can add the
  next record beside the first, or rename a new pointer over the old) and inherits the
  root's group through the set-group-ID bit; others get what the umask allows;
* a lock file is group-writable (it is opened for writing to be locked).

On a store that is not a team's, the same files follow the writer's umask alone (read-only
records: ``0444`` under umask ``022``, ``0400`` under ``077``), and directories are made with
the umask's mode, as any program makes them.

An account that may not read or write a path of the store gets :class:`AccessDenied` (exit 9)
naming the path, its owner, group and mode, and what would give access; never Python's
``PermissionError``.
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

from k3artifacts.errors import ConfigError

#: The bits of a directory the team needs (``rwx`` for the group); of a lock file (``rw``).
GROUP_DIR = stat.S_IRWXG
GROUP_LOCK = stat.S_IRGRP | stat.S_IWGRP

F = TypeVar("F", bound=Callable[..., Any])


class AccessDenied(ConfigError):
    """This account may not read or write a path of the store: the store's permissions, not
    its content, are in the way."""


def shared_gid(root: Path) -> int | None:
    """The group the store at ``root`` is shared with (its root is set-group-ID), else None."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return None
    return st.st_gid if st.st_mode & stat.S_ISGID else None


def umask() -> int:
    """This process's umask, read without changing it (``os.umask`` can only swap it, which
    another thread's file creation could see)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def record_mode(root: Path) -> int:
    """The mode of a record or pointer of the store at ``root`` (see the module's doc)."""
    mode = (0o444 & ~umask()) | stat.S_IRUSR
    return mode | stat.S_IRGRP if shared_gid(root) is not None else mode


def make_dirs(root: Path, directory: Path) -> None:
    """``mkdir -p directory`` inside the store at ``root``; on a team's store each directory
    made here is group-writable (the set-group-ID bit and the group come from its parent)."""
    missing = []
    probe = directory
    while not probe.is_dir():
        missing.append(probe)
        probe = probe.parent
    shared = shared_gid(root) is not None
    for made in reversed(missing):
        try:
            made.mkdir()
        except FileExistsError:  # another writer made it first: theirs to set
            continue
        if shared:
            os.chmod(made, stat.S_IMODE(os.stat(made).st_mode) | GROUP_DIR | stat.S_ISGID)


def open_lock(root: Path, path: Path) -> IO[bytes]:
    """A lock file of the store at ``root`` (its directory exists), opened to be locked; made
    group-writable on a team's store, where another member must open it too."""
    lock = open(path, "a+b")  # noqa: SIM115 - the caller holds it for the lock's life
    if shared_gid(root) is not None:
        st = os.fstat(lock.fileno())
        if st.st_uid == os.geteuid() and st.st_mode & GROUP_LOCK != GROUP_LOCK:
            os.fchmod(lock.fileno(), stat.S_IMODE(st.st_mode) | GROUP_LOCK)
    return lock


def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def denied(root: Path, exc: PermissionError, action: str) -> AccessDenied:
    """The named refusal for ``exc``, met doing ``action`` in the store at ``root``."""
    me = _account(os.getuid())
    where = Path(exc.filename) if exc.filename else root
    shown = where
    while True:  # the path itself, or its nearest ancestor this account can stat
        try:
            st = os.stat(shown)
            break
        except OSError:
            if shown == shown.parent:
                st = None
                break
            shown = shown.parent
    about = "" if st is None else (
        f" ({shown} is {stat.filemode(st.st_mode)} {_account(st.st_uid)}:{_group(st.st_gid)})")
    message = f"{me} may not {action} {where} in the store at {root}{about}"
    gid = shared_gid(root)
    if gid is None:
        hint = (f"the store is one account's: its owner (or root) shares it with a group of "
                f"accounts with `k3a bootstrap file://{root} --group GROUP`, then adds you to "
                "GROUP (docs/policy-and-identity.md, 'A team on one file store')")
    elif gid not in os.getgroups() and gid != os.getgid():
        hint = (f"the store is shared with group {_group(gid)}, which {me} is not in: an "
                f"administrator runs `usermod -aG {_group(gid)} {me}`; then log in again")
    else:
        hint = (f"{where} was made before the store was shared, or by a k3a that did not "
                f"share what it wrote: its owner (or root) runs `k3a bootstrap file://{root} "
                f"--group {_group(gid)}` again, which gives the group its access")
    return AccessDenied(message, hint=hint)


@contextmanager
def refusing(root: Path, action: str) -> Iterator[None]:
    """Turn a ``PermissionError`` met inside the block into :class:`AccessDenied`."""
    try:
        yield
    except PermissionError as exc:
        raise denied(root, exc, action) from None


def guarded(action: str) -> Callable[[F], F]:
    """A store method whose ``PermissionError`` becomes :class:`AccessDenied` (the store's
    ``root`` names the store in the message)."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with refusing(self.root, action):
                return method(self, *args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap
