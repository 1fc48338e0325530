"""Hashing one open file, in the calling thread or in a hashing process.

:func:`hash_fd` is what every worker thread of :mod:`.parallel` runs: it reads the file with
``preadv`` into a buffer the thread reuses, never through a mapping. A mapped file that
something else truncates kills the process that touches a page past the new end with SIGBUS,
and Python cannot catch that in a thread: whoever can write where the files lie (a pod that
shares the node cache's hostPath) could kill ``k3a verify`` or ``k3a pull`` at will. Read
into a buffer, the same truncation is a short read, reported as :class:`ChangedWhileRead`.
The buffer is small enough to stay in the core's cache, so the copy costs xxh3-128 nothing
measurable (bench/RESULTS.md).

A hashing process (beyond 8 workers, where threads stop scaling, and for large sha256 work,
where the copy would cost: :func:`k3artifacts.revisions.parallel.in_processes`) runs
:func:`serve`: it receives one open descriptor at a time with the algorithm's name over a
``SOCK_SEQPACKET`` socket, hashes the file straight from the page cache through a mapping
(:func:`hash_mapped_fd`), answers ``P<bytes>`` as it goes, then ``D<size> <hex digest>``,
``C<detail>`` (the file changed while it was read) or ``E<reason>``. There a SIGBUS kills that
process alone, and its parent reports the file as changed. It opens nothing by name: what it
reads is exactly what its parent opened. It exits when the socket closes.

Sixteen of these start at once on the pod's first check, so this module imports only what
it uses (``_socket`` rather than ``socket``, ``_thread`` rather than ``threading``, whose
Python layers cost more than the rest of the start on a busy machine).
"""

from __future__ import annotations

import _socket
import hashlib
import mmap
import os
import sys
from _thread import _local

import xxhash

#: One algorithm by the name manifests and reports use.
ALGORITHMS = {"xxh3-128": xxhash.xxh3_128, "sha256": hashlib.sha256}
#: Bytes between progress reports, and mapped at once by a hashing process: progress stays
#: frequent, call overhead nil, and mapped pages (which count in the RSS) stay one window
#: whatever the file's size.
WINDOW = 8 << 20
#: Bytes read per call into a thread's buffer: large enough that the calls cost little, small
#: enough to stay in a core's L2 cache, so the hash reads what the copy just wrote there. On
#: the 2-core machine 512 KiB hashed xxh3-128 as fast as a mapping, 4-8 MiB 10-15% slower.
BUFFER = 512 << 10
#: What the read says when a file ends before the bytes it had when it was opened.
CHANGED = "changed while it was read"

_buffers = _local()


class ChangedWhileRead(OSError):
    """The file ended before the size it had when it was opened: something truncated it (or
    shrank it) while it was read. The message says where it ended."""


def read_range(fd: int, start: int, end: int, consume, on_bytes=None) -> None:
    """Hand bytes ``[start, end)`` of the open file ``fd`` to ``consume`` in order, read with
    ``preadv`` into this thread's buffer (each view is valid only during the call); report
    them to ``on_bytes`` a :data:`WINDOW` at a time. Raises :class:`ChangedWhileRead` when the
    file ends first."""
    view = getattr(_buffers, "view", None)
    if view is None:
        view = _buffers.view = memoryview(bytearray(BUFFER))
    offset, pending = start, 0
    while offset < end:
        n = os.preadv(fd, [view[:min(BUFFER, end - offset)]], offset)
        if n == 0:
            raise ChangedWhileRead(f"{CHANGED}: it ended at byte {offset:,}, where it had "
                                   f"reached byte {end:,}")
        with view[:n] as got:
            consume(got)
        offset += n
        pending += n
        if on_bytes is not None and (pending >= WINDOW or offset == end):
            on_bytes(pending)
            pending = 0


def hash_fd(fd: int, algorithm: str, on_bytes=None) -> tuple[int, str]:
    """(size, hex digest) of the open file ``fd`` from byte 0 to the end it had when this
    began; raises :class:`ChangedWhileRead` if it ends sooner."""
    hasher = ALGORITHMS[algorithm]()
    size = os.fstat(fd).st_size
    read_range(fd, 0, size, hasher.update, on_bytes)
    return size, hasher.hexdigest()


def hash_mapped_fd(fd: int, algorithm: str, on_bytes=None) -> tuple[int, str]:
    """:func:`hash_fd` straight from the page cache, a mapped window at a time: no copy, so
    sha256 runs about 8% faster per core. Only for a hashing process: a file that shrinks
    while mapped raises SIGBUS in the process reading it, which that process dies of."""
    hasher = ALGORITHMS[algorithm]()
    size = os.fstat(fd).st_size
    offset = 0
    while offset < size:
        stop = min(size, offset + WINDOW)
        try:
            mapped = mmap.mmap(fd, stop - offset, access=mmap.ACCESS_READ, offset=offset)
        except ValueError:  # the window now lies past the end
            raise ChangedWhileRead(f"{CHANGED}: it ended before byte {stop:,}, where it had "
                                   f"reached byte {size:,}") from None
        with mapped, memoryview(mapped) as view:
            mapped.madvise(mmap.MADV_SEQUENTIAL)
            hasher.update(view)
        if on_bytes is not None:
            on_bytes(stop - offset)
        offset = stop
    return size, hasher.hexdigest()


def _receive(sock: _socket.socket) -> tuple[bytes, list[int]]:
    """A request and the descriptors passed with it (``SCM_RIGHTS``)."""
    width = 4  # a C int per descriptor
    msg, ancillary, _, _ = sock.recvmsg(64, _socket.CMSG_SPACE(width))
    fds = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(data[i:i + width], sys.byteorder, signed=True)
                    for i in range(0, len(data) - len(data) % width, width)]
    return msg, fds


def serve(fd: int, progress_step: int) -> None:
    sock = _socket.socket(fileno=fd)
    try:
        while True:
            msg, fds = _receive(sock)
            if not msg:
                return
            if len(fds) != 1:
                for stray in fds:
                    os.close(stray)
                sock.send(b"Eone descriptor must come with each request")
                continue
            pending = 0

            def progress(nbytes: int) -> None:
                nonlocal pending
                pending += nbytes
                if pending >= progress_step:
                    sock.send(b"P%d" % pending)
                    pending = 0

            try:
                size, digest = hash_mapped_fd(fds[0], msg.decode(), progress)
            except ChangedWhileRead as exc:
                sock.send(b"C" + str(exc).encode(errors="replace")[:400])
                continue
            except OSError as exc:
                sock.send(b"E" + str(exc).encode(errors="replace")[:400])
                continue
            finally:
                os.close(fds[0])
            if pending:
                sock.send(b"P%d" % pending)
            sock.send(b"D%d %s" % (size, digest.encode()))
    finally:
        sock.close()
