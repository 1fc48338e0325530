"""Streaming digests: sha256 (equality with upstream) and xxh3-128 (fast re-verification).

One pass feeds every engine, so each byte is read once whatever the number of digests.
hashlib and xxhash release the GIL on large buffers, so hashing in worker threads uses several
cores (how many files at once, and in threads or processes: :mod:`.parallel`).

>>> h = MultiHasher(); h.update(b"abc"); h.hexdigests().sha256[:16]
'ba7816bf8f01cfea'
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from k3artifacts.revisions.hashworker import read_range

CHUNK = 8 << 20


@dataclass(frozen=True)
class Digests:
    sha256: str | None
    xxh3_128: str | None
    size: int


class MultiHasher:
    def __init__(
        self,
        *,
        sha256: bool = True,
        xxh3: bool = True,
        git_blob_size: int | None = None,
        crc64nvme: bool = False,
    ):
        self._sha = hashlib.sha256() if sha256 else None
        self._xxh = xxhash.xxh3_128() if xxh3 else None
        # S3's full-object checksum: computed here it spares the upload a read of the file.
        self._crc: int | None = 0 if crc64nvme else None
        if crc64nvme:
            # Loading awscrt's native library costs ~0.1 s: only a hasher that needs it pays.
            from awscrt.checksums import crc64nvme as crc64nvme_update

            self._crc64nvme = crc64nvme_update
        # Small files on the Hub carry a git blob sha1 instead of an LFS sha256; checking it
        # needs the size up front, which the listing gives.
        self._git = None
        if git_blob_size is not None:
            self._git = hashlib.sha1(b"blob %d\0" % git_blob_size)
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        if self._sha is not None:
            self._sha.update(data)
        if self._xxh is not None:
            self._xxh.update(data)
        if self._git is not None:
            self._git.update(data)
        if self._crc is not None:
            self._crc = self._crc64nvme(data, self._crc)
        self.size += len(data)

    def hexdigests(self) -> Digests:
        return Digests(
            sha256=self._sha.hexdigest() if self._sha is not None else None,
            xxh3_128=self._xxh.hexdigest() if self._xxh is not None else None,
            size=self.size,
        )

    def git_oid(self) -> str | None:
        return None if self._git is None else self._git.hexdigest()

    def extra_checksums(self) -> dict[str, str]:
        """Store-side digests, in the form the store sends them (S3: base64 big-endian)."""
        if self._crc is None:
            return {}
        return {"crc64nvme": base64.b64encode(self._crc.to_bytes(8, "big")).decode("ascii")}


def hash_stream(
    read_into: Callable[[memoryview], int],
    hasher: MultiHasher,
    on_bytes: Callable[[int], None] | None = None,
    chunk: int = CHUNK,
) -> MultiHasher:
    """Feed ``hasher`` from a ``readinto``-style callable with one reused buffer (flat memory)."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    while True:
        n = read_into(view)
        if not n:
            return hasher
        hasher.update(view[:n])
        if on_bytes is not None:
            on_bytes(n)


def feed_file(
    hasher: MultiHasher,
    path: Path,
    *,
    on_bytes: Callable[[int], None] | None = None,
    limit: int | None = None,
) -> MultiHasher:
    """Feed ``path`` (its first ``limit`` bytes if given) to ``hasher`` in one sequential pass,
    read into this thread's buffer (:func:`~.hashworker.read_range`: never mapped, so a file
    truncated meanwhile is :class:`~.hashworker.ChangedWhileRead`, not a SIGBUS)."""
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        end = size if limit is None else min(limit, size)
        with contextlib.suppress(OSError):
            os.posix_fadvise(fh.fileno(), 0, end, os.POSIX_FADV_SEQUENTIAL)
        read_range(fh.fileno(), 0, end, hasher.update, on_bytes)
        return hasher


def feed_range(hasher: MultiHasher, fd: int, start: int, end: int) -> None:
    """Feed bytes ``[start, end)`` of the open file ``fd`` to ``hasher``: parts written by
    other threads moments ago are still in the page cache, so this reads memory, not the disk.
    Raises :class:`~.hashworker.ChangedWhileRead` if the file no longer reaches ``end``."""
    read_range(fd, start, end, hasher.update)


def hash_file(
    path: Path,
    *,
    sha256: bool = True,
    xxh3: bool = True,
    on_bytes: Callable[[int], None] | None = None,
) -> MultiHasher:
    return feed_file(MultiHasher(sha256=sha256, xxh3=xxh3), path, on_bytes=on_bytes)
