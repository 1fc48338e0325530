"""Progress of long work (staging, verify, uploads): one reporter, three displays.

A :class:`ProgressReporter` is fed byte and file counts by whoever does the work (a
:class:`StageProgress` subscribed to staging's events, verify's byte callback...) and shows
them one of three ways:

* ``bar``: rich's terminal bar, when stderr is a terminal;
* ``lines``: one log line every ``interval`` seconds (bytes done/total, rate, ETA, files
  done/total) for a Kubernetes Job, a Prefect worker or CI, whose logs otherwise show nothing
  for hours; ``--log-format json`` makes each line one JSON object for log pipelines;
* ``off``: ``--quiet``.

Counts only ever go up: a byte counted twice (a file restarted after the server ignored a
Range request, a retried S3 part) is not counted again, and a file's bytes never exceed its
size. Lines and notes go through the ``k3artifacts`` logger (:mod:`.logs`), so retries logged
by the library land in the same stream and format.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Literal

from k3artifacts.reporting.logs import configure_logging
from k3artifacts.staging.events import StageObserver

if TYPE_CHECKING:
    from rich.console import Console

    from k3artifacts.revisions.manifest import FileRecord
    from k3artifacts.staging.hub import RemoteFile
    from k3artifacts.staging.plan import StagePlan

Mode = Literal["auto", "bar", "lines", "off"]
DEFAULT_INTERVAL = 30.0

log = logging.getLogger("k3artifacts.progress")


class ProgressReporter:
    """Monotone byte and file counts of one phase, shown by a subclass. Thread-safe."""

    def __init__(self, phase: str):
        self.phase = phase
        self.bytes_done = 0
        self.bytes_total: int | None = None
        self.files_done = 0
        self.files_total: int | None = None
        #: Bytes a second stage of the same work has moved (the store's uploads and copies
        #: while staging): shown beside the main count.
        self.bytes_stored: int | None = None
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def set_total(self, *, nbytes: int | None = None, files: int | None = None) -> None:
        with self._lock:
            if nbytes is not None:
                self.bytes_total = nbytes
            if files is not None:
                self.files_total = files
        self._changed()

    def advance(self, nbytes: int) -> None:
        if nbytes <= 0:  # a rewind (s3transfer retrying a part) never moves a count back
            return
        with self._lock:
            self.bytes_done += nbytes
            if self.bytes_total is not None:
                self.bytes_done = min(self.bytes_done, self.bytes_total)
        self._changed()

    def file_done(self, count: int = 1) -> None:
        with self._lock:
            self.files_done += count
        self._changed()

    def stored(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._lock:
            self.bytes_stored = (self.bytes_stored or 0) + nbytes
        self._changed()

    def note(self, message: str) -> None:
        log.info(message, extra={"k3a": {"event": "note", "phase": self.phase}})

    def snapshot(self) -> dict[str, int | float | str | None]:
        with self._lock:
            return {
                "phase": self.phase,
                "bytes_done": self.bytes_done,
                "bytes_total": self.bytes_total,
                "files_done": self.files_done,
                "files_total": self.files_total,
                "bytes_stored": self.bytes_stored,
                "elapsed_s": round(time.monotonic() - self.started, 1),
            }

    def _changed(self) -> None: ...

    def start(self) -> None: ...

    def close(self, ok: bool = True) -> None:
        """Stop showing; ``ok=False`` when the work failed (no "done" line then)."""

    def __enter__(self) -> ProgressReporter:
        self.start()
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(ok=exc_type is None)


class SilentReporter(ProgressReporter):
    """``--quiet`` (and ``--json`` on a terminal): counts kept, nothing shown, notes dropped."""

    def note(self, message: str) -> None:
        pass


class BarReporter(ProgressReporter):
    """rich's bar on stderr; notes and library log lines print above it."""

    def __init__(self, phase: str, console: Console | None = None):
        # Only a terminal shows the bar: rich is imported for it alone (k3a starts faster).
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

        from k3artifacts.settings import no_color

        super().__init__(phase)
        self.console = console or Console(stderr=True, no_color=no_color())
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[files]}"),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task(phase, total=None, files="")
        self._shown = 0

    def _changed(self) -> None:
        with self._lock:
            # rich advances by deltas: hand it what this reporter counted since last time.
            delta, self._shown = self.bytes_done - self._shown, self.bytes_done
            files = (f"{self.files_done}/{self.files_total} files"
                     if self.files_total is not None else "")
            if self.bytes_stored is not None:
                files += f", {human_size(self.bytes_stored)} stored"
            self.progress.update(self.task, total=self.bytes_total, advance=delta, files=files)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False, markup=False, soft_wrap=True)

    def start(self) -> None:
        self.progress.start()

    def close(self, ok: bool = True) -> None:
        if not ok and self.bytes_done == 0 and self.files_done == 0:
            # Work that failed before its first byte (not published, no such store): an empty
            # bar above the error says nothing, so it leaves the screen. A bar that moved
            # stays: it shows how far the work got.
            self.progress.live.transient = True
        self.progress.stop()


class LineReporter(ProgressReporter):
    """One ``progress`` log record every ``interval`` seconds, and one at the end.

    A background timer, not the byte callbacks, decides when to log: a transfer that stalls
    still logs (its rate at 0), which is what an operator watching a Job's logs needs to see.
    """

    def __init__(self, phase: str, interval: float = DEFAULT_INTERVAL):
        super().__init__(phase)
        self.interval = max(0.05, interval)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_bytes = 0
        self._last_time = self.started

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="k3a-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.emit()

    def emit(self, final: bool = False) -> dict[str, int | float | str | None]:
        now = time.monotonic()
        fields = self.snapshot()
        done, total = fields["bytes_done"], fields["bytes_total"]
        assert isinstance(done, int)
        span = now - self._last_time
        rate = (done - self._last_bytes) / span if span > 0 else 0.0
        if final:
            elapsed = now - self.started
            rate = done / elapsed if elapsed > 0 else 0.0
        self._last_bytes, self._last_time = done, now
        eta = None
        if isinstance(total, int) and rate > 0:
            eta = round((total - done) / rate, 1)
        fields.update(
            event="progress",
            rate_bytes_per_s=round(rate),
            eta_s=eta,
            percent=round(100 * done / total, 1) if isinstance(total, int) and total else None,
            final=final,
        )
        log.info(_describe(fields), extra={"k3a": fields})
        return fields

    def close(self, ok: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if ok:
            self.emit(final=True)


def human_size(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1 (``512 B``, ``3.2 MiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _describe(f: dict) -> str:
    """The human half of a progress line (the text log format prints only this)."""
    total = f["bytes_total"]
    parts = [f"{f['phase']}:", human_size(f["bytes_done"])]
    if total is not None:
        parts += ["of", human_size(total), f"({f['percent']}%)" if f["percent"] is not None else ""]
    parts.append(f"at {human_size(f['rate_bytes_per_s'])}/s")
    if f["eta_s"] is not None and not f["final"]:
        parts.append(f"ETA {_duration(f['eta_s'])}")
    if f["files_total"] is not None:
        parts.append(f"files {f['files_done']}/{f['files_total']}")
    if f["bytes_stored"] is not None:
        parts.append(f"stored {human_size(f['bytes_stored'])}")
    if f["final"]:
        parts.append(f"done in {_duration(f['elapsed_s'])}")
    return " ".join(p for p in parts if p)


def make_reporter(
    phase: str,
    *,
    mode: Mode = "auto",
    interval: float = DEFAULT_INTERVAL,
    log_format: str = "text",
    quiet: bool = False,
) -> ProgressReporter:
    """The display that suits where stderr goes: a bar on a terminal, lines elsewhere.

    ``log_format="json"`` asks for lines even on a terminal (a log pipeline wants them all).
    Also points the ``k3artifacts`` logger at stderr in ``log_format``.
    """
    if quiet:
        configure_logging(log_format, level=logging.WARNING)
        return SilentReporter(phase)
    configure_logging(log_format)
    if mode == "auto":
        terminal = sys.stderr.isatty() and log_format == "text"
        mode = "bar" if terminal else "lines"
    if mode == "bar":
        return BarReporter(phase)
    if mode == "lines":
        return LineReporter(phase, interval)
    return SilentReporter(phase)


class StageProgress(StageObserver):
    """Staging's events, turned into a reporter's counts.

    Bytes are counted per file and capped at the file's size, so a file downloaded again from
    byte 0 (the server ignored Range) or resumed from a partial file never counts twice.
    """

    def __init__(self, reporter: ProgressReporter):
        self.reporter = reporter
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        self._counted: dict[str, int] = {}
        self._stored: dict[str, int] = {}

    def planned(
        self, files: list[RemoteFile], reused: set[str], plan: StagePlan | None = None
    ) -> None:
        with self._lock:
            self._sizes = {f.path: f.size for f in files}
        self.reporter.set_total(nbytes=sum(self._sizes.values()), files=len(files))
        present = len(plan.of("present")) if plan is not None else len(reused)
        if present:
            self.reporter.note(f"resuming: {present} of {len(files)} file(s) already "
                               "verified in quarantine")

    def _count(self, path: str, nbytes: int) -> int:
        with self._lock:
            size = self._sizes.get(path)
            before = self._counted.get(path, 0)
            after = before + nbytes if size is None else min(size, before + nbytes)
            self._counted[path] = after
            return after - before

    def advance(self, path: str, nbytes: int) -> None:
        self.reporter.advance(self._count(path, max(0, nbytes)))

    def file_done(self, record: FileRecord, reused: bool) -> None:
        # Whatever was not seen as bytes (a reused file, a resumed tail) is done now.
        with self._lock:
            self._sizes.setdefault(record.path, record.size)
            missing = record.size - self._counted.get(record.path, 0)
        self.reporter.advance(self._count(record.path, missing))
        self.reporter.file_done()

    def note(self, message: str) -> None:
        self.reporter.note(message)

    def store_progress(self, path: str, nbytes: int) -> None:
        """The store's byte callback (an S3 store's uploads and in-bucket copies): a part
        sent again after a retry is not counted twice, a file never beyond its size."""
        with self._lock:
            size = self._sizes.get(path)
            before = self._stored.get(path, 0)
            after = before + max(0, nbytes)
            if size is not None:
                after = min(size, after)
            self._stored[path] = after
        self.reporter.stored(after - before)


class BytesProgress:
    """A byte callback (verify's ``on_bytes``, an upload's progress) feeding a reporter."""

    def __init__(self, reporter: ProgressReporter):
        self.reporter = reporter

    def set_total(self, total: int, files: int | None = None) -> None:
        self.reporter.set_total(nbytes=total, files=files)

    def __call__(self, nbytes: int) -> None:
        self.reporter.advance(nbytes)

    def file_done(self, *_: object) -> None:
        self.reporter.file_done()
