"""Bytes held at once by threads of one process, under a limit.

Staging holds two such budgets: the local quarantine's window over the files in flight
(``--window``) and the S3 store's part buffers in memory (``K3A_S3_BUFFER``). A holder takes
its size before it holds the bytes and gives it back after; one bigger than the whole limit
goes alone rather than never.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class ByteBudget:
    """At most ``limit`` bytes held at once (None: no limit). Thread-safe."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.used = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def held(self, nbytes: int) -> Iterator[None]:
        limit = self.limit
        if limit is None:
            yield
            return
        with self._cond:
            self._cond.wait_for(lambda: self.used == 0 or self.used + nbytes <= limit)
            self.used += nbytes
        try:
            yield
        finally:
            with self._cond:
                self.used -= nbytes
                self._cond.notify_all()
