"""Paths under a node cache root, reached without following a link.

The cache is a hostPath shared by pods: anything that can write there can plant a symbolic
link at a path k3a is about to write (the partial directory, a part file, the final
directory) and so redirect a pull outside the root, or truncate and chmod a file elsewhere.
Every name under the root is therefore opened relative to its parent's directory descriptor
with ``O_NOFOLLOW`` (``openat`` and friends through ``dir_fd=``); a link met on the way is
refused and named (:class:`~k3artifacts.errors.UnsafeCacheEntry`, exit 9), never followed and
never deleted (it is evidence). The root itself is the operator's choice and may be a link.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from k3artifacts.errors import UnsafeCacheEntry

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Read-only, whatever the umask: a finished revision is not edited in place.
FILE_MODE = 0o444
DIR_MODE = 0o555
#: Directories nest at most this deep under a revision (a real one nests 2 or 3): a planted
#: tree a thousand deep would otherwise exhaust the recursion and the descriptors walking it.
MAX_DEPTH = 64


def _refuse(path: Path, st: os.stat_result | None) -> UnsafeCacheEntry:
    if st is not None and stat.S_ISLNK(st.st_mode):
        what = f"a symbolic link (to {os.readlink(path)!r})" if _readable_link(path) else \
            "a symbolic link"
    elif st is not None and stat.S_ISDIR(st.st_mode):
        what = "a directory where a file belongs"
    elif st is not None and not stat.S_ISREG(st.st_mode):
        what = "neither a file nor a directory"
    else:
        what = "not a directory"
    return UnsafeCacheEntry(f"{path} is {what}; k3a follows no link in the node cache and "
                            "wrote nothing through it")


def _readable_link(path: Path) -> bool:
    try:
        os.readlink(path)
    except OSError:
        return False
    return True


class Dir:
    """An open directory under the cache root; ``path`` is for messages only."""

    def __init__(self, fd: int, path: Path):
        self.fd = fd
        self.path = path

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def refuse(self, name: str) -> UnsafeCacheEntry:
        return _refuse(self.path / name, self.lstat(name))

    def sub_within(self, name: str, depth: int) -> Dir:
        """:meth:`sub` for a tree walk ``depth`` levels down, refused past :data:`MAX_DEPTH`."""
        if depth >= MAX_DEPTH:
            raise UnsafeCacheEntry(f"{self.path / name} nests deeper than {MAX_DEPTH} "
                                   "directories; k3a does not walk it")
        return self.sub(name)

    def sub(self, name: str, *, create: bool = False, mode: int = 0o755) -> Dir:
        """The directory ``name`` in this one (made when ``create``); refused when ``name``
        is a link or a file."""
        for _ in range(2):
            try:
                return Dir(os.open(name, _DIR_FLAGS, dir_fd=self.fd), self.path / name)
            except FileNotFoundError:
                if not create:
                    raise
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise self.refuse(name) from None
                raise
            try:
                os.mkdir(name, mode, dir_fd=self.fd)
            except FileExistsError:
                pass  # made meanwhile (or a link: the next open refuses it)
        raise self.refuse(name)

    def walk(self, parts: list[str] | tuple[str, ...], *, create: bool = False) -> Dir:
        here = Dir(os.dup(self.fd), self.path)
        try:
            for part in parts:
                nxt = here.sub(part, create=create)
                here.close()
                here = nxt
        except BaseException:
            here.close()
            raise
        return here

    def open(self, name: str, flags: int, mode: int = 0o644) -> int:
        """``openat`` with ``O_NOFOLLOW``: a link at ``name`` is refused, not followed."""
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise self.refuse(name) from None
            raise

    def open_regular(self, name: str, flags: int) -> int:
        """An existing regular file (a FIFO or device planted there is refused)."""
        fd = self.open(name, flags | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self.refuse(name)
        os.set_blocking(fd, True)
        return fd

    def create_new(self, name: str, mode: int = 0o644) -> int:
        """A fresh file at ``name``, replacing the file there (a link there is refused; a hard
        link there loses only this name, never its other file's bytes)."""
        self.unlink(name)
        return self.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)

    def read_bytes(self, name: str) -> bytes | None:
        try:
            fd = self.open_regular(name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as fh:
            return fh.read()

    def write_file(self, name: str, data: bytes, mode: int = FILE_MODE) -> None:
        """Write ``data`` to a temporary name, sync, chmod, rename onto ``name``."""
        tmp = f".{name}.tmp"
        fd = self.create_new(tmp)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.replace(tmp, self, name)

    def unlink(self, name: str) -> None:
        """Remove the regular file ``name`` if there; anything else there (a link, a
        directory) is refused and left as it is."""
        st = self.lstat(name)
        if st is None:
            return
        if not stat.S_ISREG(st.st_mode):
            raise self.refuse(name)
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def replace(self, name: str, dst: Dir, dst_name: str) -> None:
        os.replace(name, dst_name, src_dir_fd=self.fd, dst_dir_fd=dst.fd)

    def link(self, src: Dir, src_name: str, name: str) -> None:
        os.link(src_name, name, src_dir_fd=src.fd, dst_dir_fd=self.fd, follow_symlinks=False)

    def entries(self) -> Iterator[tuple[str, os.stat_result]]:
        for name in os.listdir(self.fd):
            st = self.lstat(name)
            if st is not None:
                yield name, st

    def fsync(self) -> None:
        os.fsync(self.fd)

    def utime(self, name: str) -> None:
        os.utime(name, dir_fd=self.fd, follow_symlinks=False)


def open_root(root: Path, *, create: bool = True) -> Dir:
    """The cache root (a link *to* the root is the operator's choice and is followed)."""
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return Dir(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), root)


def walk_files(top: Dir, prefix: str = "", depth: int = 0
               ) -> Iterator[tuple[Dir, str, str, os.stat_result]]:
    """(parent dir, name, relative path, lstat) of every regular file under ``top``; a link
    or special file anywhere is refused."""
    for name, st in sorted(top.entries()):
        rel = f"{prefix}{name}"
        if stat.S_ISDIR(st.st_mode):
            with top.sub_within(name, depth) as child:
                yield from walk_files(child, rel + "/", depth + 1)
        elif stat.S_ISREG(st.st_mode):
            yield top, name, rel, st
        else:
            raise top.refuse(name)


def set_read_only(top: Dir, depth: int = 0) -> None:
    """Files 0444 and directories 0555 under ``top`` and ``top`` itself, whatever the umask
    (a directory last, once nothing more is made in it)."""
    for name, st in top.entries():
        if stat.S_ISDIR(st.st_mode):
            with top.sub_within(name, depth) as child:
                set_read_only(child, depth + 1)
        elif stat.S_ISREG(st.st_mode):
            if stat.S_IMODE(st.st_mode) != FILE_MODE:
                fd = top.open_regular(name, os.O_RDONLY)
                try:
                    os.fchmod(fd, FILE_MODE)
                finally:
                    os.close(fd)
        else:
            raise top.refuse(name)
    os.fchmod(top.fd, DIR_MODE)


def make_writable(top: Dir, depth: int = 0) -> None:
    """Directories back to 0755 (files stay read-only): before files are removed or added."""
    os.fchmod(top.fd, 0o755)
    for name, st in top.entries():
        if stat.S_ISDIR(st.st_mode):
            with top.sub_within(name, depth) as child:
                make_writable(child, depth + 1)


def _a_directory_to_empty(parent: Dir, name: str) -> bool:
    """Whether ``name`` under ``parent`` is a directory whose entries are to go first; a file
    is unlinked here (a link refused, by :meth:`Dir.unlink`), and nothing there is nothing to
    do."""
    st = parent.lstat(name)
    if st is None:
        return False
    if not stat.S_ISDIR(st.st_mode):
        parent.unlink(name)
        return False
    return True


def remove_tree(parent: Dir, name: str, depth: int = 0) -> None:
    """Delete the directory ``name`` and everything in it; links in it are removed as links,
    never followed."""
    if not _a_directory_to_empty(parent, name):
        return
    with parent.sub_within(name, depth) as top:
        os.fchmod(top.fd, 0o755)
        for child, cst in top.entries():
            if stat.S_ISDIR(cst.st_mode):
                remove_tree(top, child, depth + 1)
            else:
                os.unlink(child, dir_fd=top.fd)
    os.rmdir(name, dir_fd=parent.fd)


def remove_any_depth(parent: Dir, name: str) -> None:
    """Delete ``name`` under ``parent`` (a file, or a whole directory, whose links are removed
    as links; a link at ``name`` itself is refused, as everywhere here), however deep it
    nests. :func:`remove_tree` stops at ``MAX_DEPTH`` so that a planted tree cannot exhaust the
    stack or the descriptors; here a deeper tree is flattened instead: each directory two
    levels down is moved up beside its grandparent (a rename inside the tree, no link
    followed) until the top holds only files and empty directories, two descriptors open at a
    time."""
    if not _a_directory_to_empty(parent, name):
        return
    with parent.sub(name) as top:
        os.fchmod(top.fd, 0o755)
        hoisted = 0
        while children := list(top.entries()):
            for child, cst in children:
                if not stat.S_ISDIR(cst.st_mode):
                    os.unlink(child, dir_fd=top.fd)
                    continue
                with top.sub(child) as sub:
                    os.fchmod(sub.fd, 0o755)
                    for grand, gst in list(sub.entries()):
                        if not stat.S_ISDIR(gst.st_mode):
                            os.unlink(grand, dir_fd=sub.fd)
                            continue
                        with sub.sub(grand) as moving:  # a moved directory rewrites its ".."
                            os.fchmod(moving.fd, 0o755)
                        while top.lstat(f".k3a-flat-{hoisted}") is not None:
                            hoisted += 1
                        sub.replace(grand, top, f".k3a-flat-{hoisted}")
                        hoisted += 1
                os.rmdir(child, dir_fd=top.fd)
    os.rmdir(name, dir_fd=parent.fd)
