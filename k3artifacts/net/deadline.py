"""A total deadline over reading an answer, enforced on every socket read.

A read timeout bounds the silence between two bytes: a peer sending one header byte every
2 s never trips a 60 s read timeout, and ``http.client`` accepts 100 header lines of 64 KiB
each. Inside :func:`within`, each ``recv`` of the current thread waits at most the time left
until the deadline (and never more than the read timeout), so a whole answer's headers, or a
whole small answer, arrive within it or the read fails as a timeout; :func:`expired` then says
the deadline, not the read timeout, ended it.

urllib3 reads through ``http.client``, which reads headers and body from the file
``sock.makefile("rb")`` gives it: :class:`BoundedResponse` (the ``response_class`` of the
connections :mod:`.pool` makes) reads through :class:`_BoundedSocketReader` instead. httpx
reads through httpcore's network streams: :mod:`.endpoint` wraps those.
"""

from __future__ import annotations

import http.client
import io
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


class DeadlinePassed(TimeoutError):
    """A read was asked after the current deadline: raised as the timeout it is."""


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Reads of this thread within ``seconds`` from now, in all (nested: the earlier wins)."""
    outer = getattr(_local, "deadline", None)
    mine = time.monotonic() + seconds
    _local.deadline = mine if outer is None else min(outer, mine)
    _local.expired = False
    try:
        yield
    finally:
        _local.deadline = outer


def left() -> float | None:
    """Seconds until this thread's current deadline (None: none set)."""
    deadline = getattr(_local, "deadline", None)
    return None if deadline is None else deadline - time.monotonic()


def expired() -> bool:
    """Whether the last :func:`within` of this thread ended a read (not a plain timeout)."""
    return bool(getattr(_local, "expired", False))


def bound(timeout: float | None) -> tuple[float | None, bool]:
    """``timeout`` for the next read of this thread, shortened to the time left before the
    deadline, and whether the deadline is what bounds it; raise :class:`DeadlinePassed` when
    no time is left."""
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return timeout, False
    left = deadline - time.monotonic()
    if left <= 0:
        _local.expired = True
        raise DeadlinePassed("the answer did not arrive within its deadline")
    if timeout is None or left < timeout:
        return left, True
    return timeout, False


def timed_out(by_deadline: bool) -> None:
    """Note that a read bounded as :func:`bound` said has just timed out."""
    if by_deadline:
        _local.expired = True


class _BoundedSocketReader(io.RawIOBase):
    """The raw reader under ``http.client``'s buffered file: one ``recv_into`` per read, each
    bounded by :func:`bound`.

    ``holder`` is the file ``http.client`` opened on the socket: while it is open the
    socket's descriptor is too, even after the connection closes the socket (urllib3 does
    that at once for an answer read until the peer closes), so it is closed with this reader,
    never before."""

    def __init__(self, sock: socket.socket, holder: io.IOBase):
        super().__init__()
        self._sock = sock
        self._holder = holder
        #: What urllib3 set for this answer (the read timeout) just before reading it.
        self._timeout = sock.gettimeout()

    def close(self) -> None:
        super().close()
        self._holder.close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        timeout, by_deadline = bound(self._timeout)
        self._sock.settimeout(timeout)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            timed_out(by_deadline)
            raise


class BoundedResponse(http.client.HTTPResponse):
    """``http.client``'s response, reading headers and body through the deadline."""

    def __init__(self, sock: socket.socket, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(sock, *args, **kwargs)
        # Nothing was read from the file http.client opened yet: read through ours instead.
        self.fp = io.BufferedReader(_BoundedSocketReader(sock, self.fp))
