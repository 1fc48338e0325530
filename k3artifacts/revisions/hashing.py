"""Streaming digests: sha256 (equality with upstream) and xxh3-128 (fast re-verification).

One pass feeds every engine, so each byte is read once whatever the number of digests.
hashlib and xxhash release the GIL on large buffers, so hashing in worker threads uses several
cores (how many files at once, and in threads or processes: :mod:`.parallel`).

>>> h = MultiHasher(); h.update(b"abc"); h.hexdigests().sha256[:16]
'ba7816bf8f01cfea'
"""

from __future__ import annotations

import base64
import hashlib
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

CHUNK = 8 << 20
#: Bytes of a mapped file hashed per call: progress callbacks stay frequent, call overhead nil.
MAP_STEP = 8 << 20


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
    """Feed ``path`` (its first ``limit`` bytes if given) to ``hasher`` in one sequential pass.

    The file is memory-mapped so the engines read the page cache directly: a ``read()`` into a
    buffer costs one more copy of every byte through the CPU cache, and on a warm cache that
    copy, not the hash, was the limit (xxh3 re-verification ran at a third of ``cat``).
    A file that shrinks while mapped kills the process with SIGBUS: published files are
    read-only and quarantine files are ours, and dying is a failed verification anyway.
    """
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        end = size if limit is None else min(limit, size)
        if end == 0:
            return hasher
        try:
            mapped = mmap.mmap(fh.fileno(), end, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            # Not mappable (some FUSE or special files): read it instead.
            return _read_file(fh, hasher, on_bytes, limit)
        with mapped:
            mapped.madvise(mmap.MADV_SEQUENTIAL)
            with memoryview(mapped) as view:
                for offset in range(0, end, MAP_STEP):
                    with view[offset : offset + MAP_STEP] as step:
                        hasher.update(step)
                        if on_bytes is not None:
                            on_bytes(len(step))
        return hasher


def feed_range(hasher: MultiHasher, fd: int, start: int, end: int) -> None:
    """Feed bytes ``[start, end)`` of the open file ``fd`` to ``hasher``, straight from the page
    cache (no copy), a window at a time: mapped pages count in the process's RSS, so mapping a
    whole multi-GB range would make memory grow with its size. Parts written by other threads
    moments ago are still hot there, so this reads memory, not the disk."""
    offset = start
    while offset < end:
        # mmap offsets must be page-aligned; a range resumed at an odd byte maps from before it.
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        stop = min(end, base + MAP_STEP)
        with mmap.mmap(fd, stop - base, access=mmap.ACCESS_READ, offset=base) as mapped, \
                memoryview(mapped) as view, view[offset - base:] as window:
            hasher.update(window)
        offset = stop


def _read_file(fh, hasher: MultiHasher, on_bytes, limit: int | None) -> MultiHasher:
    try:
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except (AttributeError, OSError):
        pass
    if limit is None:
        return hash_stream(fh.readinto, hasher, on_bytes)
    remaining = limit

    def bounded(view: memoryview) -> int:
        nonlocal remaining
        if remaining <= 0:
            return 0
        n = fh.readinto(view[: min(len(view), remaining)])
        remaining -= n
        return n

    return hash_stream(bounded, hasher, on_bytes)


def hash_file(
    path: Path,
    *,
    sha256: bool = True,
    xxh3: bool = True,
    on_bytes: Callable[[int], None] | None = None,
) -> MultiHasher:
    return feed_file(MultiHasher(sha256=sha256, xxh3=xxh3), path, on_bytes=on_bytes)
