"""A hashing process (:mod:`.parallel` starts one per core for sha256).

It receives one open descriptor at a time with the algorithm's name over a ``SOCK_SEQPACKET``
socket, hashes the file from byte 0 to its end (:func:`~.hashing.hash_fd`) and answers
``P<bytes>`` as it goes, then ``D<size> <hex digest>``, or ``E<reason>``. It opens nothing by
name: what it reads is exactly what its parent opened. It exits when the socket closes.
"""

from __future__ import annotations

import os
import socket

from k3artifacts.revisions.hashing import hash_fd


def serve(fd: int, progress_step: int) -> None:
    sock = socket.socket(fileno=fd)
    with sock:
        while True:
            msg, fds, _, _ = socket.recv_fds(sock, 64, 1)
            if not msg:
                return
            if len(fds) != 1:
                for stray in fds:
                    os.close(stray)
                sock.send(b"Eno descriptor came with the request")
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
