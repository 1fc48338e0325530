"""Terminal progress for long work: bytes, rate and ETA, as a subscriber of the work."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from k3artifacts.staging.events import StageObserver

if TYPE_CHECKING:
    from k3artifacts.revisions.manifest import FileRecord
    from k3artifacts.staging.hub import RemoteFile


def make_progress(enabled: bool) -> Progress:
    console = Console(stderr=True)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[files]}"),
        console=console,
        disable=not (enabled and console.is_terminal),
        transient=False,
    )


class StageProgress(StageObserver):
    """One bar over the bytes of the whole revision; notes go to stderr as lines."""

    def __init__(self, progress: Progress, quiet: bool = False):
        self.progress = progress
        self.quiet = quiet
        self.task = progress.add_task("staging", total=None, files="")
        self._lock = threading.Lock()
        self._done = 0
        self._total_files = 0

    def planned(self, files: list[RemoteFile], reused: set[str]) -> None:
        self._total_files = len(files)
        self.progress.update(self.task, total=sum(f.size for f in files), files=self._files())
        if reused and not self.quiet:
            self.note(f"resuming: {len(reused)} file(s) already verified in quarantine")

    def _files(self) -> str:
        return f"{self._done}/{self._total_files} files"

    def advance(self, path: str, nbytes: int) -> None:
        self.progress.advance(self.task, nbytes)

    def file_done(self, record: FileRecord, reused: bool) -> None:
        with self._lock:
            self._done += 1
            if reused:
                self.progress.advance(self.task, record.size)
            self.progress.update(self.task, files=self._files())

    def note(self, message: str) -> None:
        if not self.quiet:
            self.progress.console.print(message, highlight=False, markup=False, soft_wrap=True)


class BytesProgress:
    """A single byte bar for verify and uploads."""

    def __init__(self, progress: Progress, description: str):
        self.progress = progress
        self.task = progress.add_task(description, total=None, files="")

    def set_total(self, total: int) -> None:
        self.progress.update(self.task, total=total)

    def __call__(self, nbytes: int) -> None:
        self.progress.advance(self.task, nbytes)


class PeriodicLog:
    """Progress as a line on stderr every ``interval`` seconds, for logs (no terminal)."""

    def __init__(self, description: str, interval: float = 10.0):
        import time

        self._clock = time.monotonic
        self.description = description
        self.interval = interval
        self.total = 0
        self.done = 0
        self._start = self._last = self._clock()
        self._lock = threading.Lock()

    def set_total(self, total: int, done: int = 0) -> None:
        self.total, self.done = total, done

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            now = self._clock()
            if now - self._last < self.interval:
                return
            self._last = now
        rate = self.done / max(now - self._start, 1e-9)
        import sys

        print(f"k3a: {self.description}: {self.done / 2**30:.2f} of {self.total / 2**30:.2f} "
              f"GiB, {rate / 1e6:.0f} MB/s", file=sys.stderr, flush=True)
