"""A Prefect progress artifact fed by staging's byte callbacks, throttled.

The flow creates one per run; per-file tasks running in the flow's process (the thread-pool
runner, or a Dask cluster with ``processes=False``) find it in :data:`_LIVE` and report bytes as
they arrive. Tasks in other processes cannot reach it: the flow then advances it once per
finished file (:meth:`ByteProgress.file_done` counts whatever the task did not report), so the
artifact is right either way, only coarser.
"""

from __future__ import annotations

import threading
import time

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from k3artifacts.staging.engine import StageObserver

#: Reporters of flow runs in this process, by artifact id.
_LIVE: dict[str, ByteProgress] = {}


class ByteProgress:
    def __init__(
        self,
        key: str,
        description: str,
        total: int,
        done: int = 0,
        *,
        min_step: float = 2.0,
        min_interval: float = 1.0,
    ):
        self.total = max(total, 1)
        self.done = done
        self.description = description
        # Each update is one API call; a 1.56 TB run must not make millions of them.
        self.min_step = min_step
        self.min_interval = min_interval
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sent = self.percent()
        self._sent_at = time.monotonic()
        self.id = str(create_progress_artifact(self._sent, key=key, description=description))
        _LIVE[self.id] = self

    def percent(self) -> float:
        return round(min(100.0, 100.0 * self.done / self.total), 1)

    def advance(self, path: str, nbytes: int) -> None:
        with self._lock:
            self._seen[path] = self._seen.get(path, 0) + nbytes
            self.done += nbytes
            pct = self.percent()
            now = time.monotonic()
            if pct - self._sent < self.min_step or now - self._sent_at < self.min_interval:
                return
            self._sent, self._sent_at = pct, now
        self._send(pct)

    def file_done(self, path: str, size: int) -> None:
        """A task finished ``path``: count the bytes it could not report from its process."""
        with self._lock:
            missing = size - min(self._seen.get(path, 0), size)
            self._seen[path] = size
            self.done += missing
            pct = self.percent()
            self._sent, self._sent_at = pct, time.monotonic()
        self._send(pct)

    def close(self) -> None:
        _LIVE.pop(self.id, None)

    def _send(self, pct: float) -> None:
        update_progress_artifact(self.id, pct)


class TaskObserver(StageObserver):
    """Forwards a task's byte callbacks to its flow's reporter, when in the same process."""

    def __init__(self, reporter: ByteProgress):
        self.reporter = reporter

    def advance(self, path: str, nbytes: int) -> None:
        self.reporter.advance(path, nbytes)


def observer_for(progress_id: str | None) -> StageObserver | None:
    reporter = _LIVE.get(progress_id) if progress_id else None
    return TaskObserver(reporter) if reporter else None
