"""What a staging run shows in the Prefect UI, as a subscriber of the engine's events.

A :class:`FlowObserver` keeps the files table (one row per file: size, sha256, status) and a
progress artifact. Byte events arrive from jobs running in the flow's own process; for jobs on
other workers the engine reports a file's bytes when its outcome comes back, so the artifact
is right either way, only coarser.
"""

from __future__ import annotations

import threading
import time

from prefect import get_run_logger
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from k3artifacts.errors import Refusal
from k3artifacts.revisions.manifest import FileRecord
from k3artifacts.staging.events import StageObserver
from k3artifacts.staging.hub import RemoteFile


class ByteProgress:
    """A progress artifact fed by byte counts, throttled: each update is one API call, and a
    1.56 TB run must not make millions of them."""

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
        self.min_step = min_step
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._sent = self.percent()
        self._sent_at = time.monotonic()
        self.id = create_progress_artifact(self._sent, key=key, description=description)

    def percent(self) -> float:
        return round(min(100.0, 100.0 * self.done / self.total), 1)

    def advance(self, nbytes: int, *, force: bool = False) -> None:
        with self._lock:
            self.done += nbytes
            pct = self.percent()
            now = time.monotonic()
            if not force and (
                pct - self._sent < self.min_step or now - self._sent_at < self.min_interval
            ):
                return
            self._sent, self._sent_at = pct, now
        update_progress_artifact(self.id, pct)


class FlowObserver(StageObserver):
    """The files table and the byte progress of one staging run."""

    def __init__(self, key: str, title: str):
        self.key = key
        self.title = title
        self.rows: dict[str, dict[str, object]] = {}
        self.progress: ByteProgress | None = None

    def planned(self, files: list[RemoteFile], reused: set[str]) -> None:
        self.rows = {
            f.path: {"path": f.path, "size": f.size, "sha256": "", "status": "pending"}
            for f in files
        }
        self.progress = ByteProgress(
            f"{self.key}-progress", f"bytes of {self.title} verified in quarantine",
            total=sum(f.size for f in files),
            done=sum(f.size for f in files if f.path in reused),
        )

    def advance(self, path: str, nbytes: int) -> None:
        if self.progress is not None:
            self.progress.advance(nbytes)

    def file_done(self, record: FileRecord, reused: bool) -> None:
        self.rows[record.path].update(
            sha256=record.sha256, status="reused" if reused else "downloaded"
        )
        if not reused and self.progress is not None:
            self.progress.advance(0, force=True)

    def file_failed(self, path: str, error: BaseException) -> None:
        status = (
            f"refused: {error.rule}"
            if isinstance(error, Refusal)
            else f"failed: {type(error).__name__}"
        )
        self.rows[path]["status"] = status

    def note(self, message: str) -> None:
        get_run_logger().info("%s", message)

    def publish_table(self) -> None:
        if self.rows:
            create_table_artifact(
                list(self.rows.values()), key=f"{self.key}-files",
                description=f"files of {self.title}: size, sha256, status",
            )
