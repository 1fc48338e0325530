"""Hashing one open file, in the calling thread or in a hashing process.

:func:`hash_fd` is what every worker of :mod:`.parallel` runs. A hashing process (for sha256
beyond a few workers) runs :func:`serve`: it receives one open descriptor at a time with the
algorithm's name over a ``SOCK_SEQPACKET`` socket, hashes the file and answers ``P<bytes>``
as it goes, then ``D<size> <hex digest>``, or ``E<reason>``. It opens nothing by name: what
it reads is exactly what its parent opened. It exits when the socket closes.

Sixteen of these start at once on the pod's first check, so this module imports only what
it uses (``_socket`` rather than ``socket``, whose Python layer costs more than the rest of
the start on a busy machine).
"""

from __future__ import annotations

import _socket
import hashlib
import mmap
import os
import sys

import xxhash

#: One algorithm by the name manifests and reports use.
ALGORITHMS = {"xxh3-128": xxhash.xxh3_128, "sha256": hashlib.sha256}
#: Bytes mapped and hashed per call: progress stays frequent, call overhead nil, and mapped
#: pages (which count in the RSS) stay one window whatever the file's size.
WINDOW = 8 << 20


def hash_fd(fd: int, algorithm: str, on_bytes=None) -> tuple[int, str]:
    """(size, hex digest) of the open file ``fd`` from byte 0 to its end, read straight from
    the page cache a window at a time. A file that shrinks while mapped raises SIGBUS in the
    process reading it (:mod:`.parallel` says what that costs where)."""
    hasher = ALGORITHMS[algorithm]()
    size = os.fstat(fd).st_size
    offset = 0
    while offset < size:
        stop = min(size, offset + WINDOW)
        try:
            mapped = mmap.mmap(fd, stop - offset, access=mmap.ACCESS_READ, offset=offset)
        except ValueError:  # the window now lies past the end
            raise OSError(f"the file shrank while it was read (below {stop:,} of "
                          f"{size:,} bytes)") from None
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
                size, digest = hash_fd(fds[0], msg.decode(), progress)
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
