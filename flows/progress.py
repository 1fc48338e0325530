"""What a staging run shows in the Prefect UI while it runs, as a subscriber of the engine.

A :class:`FlowObserver` keeps three artifacts of one run, all created when the plan is known
and then updated in place (:class:`flows.artifacts.LiveArtifact`) on a steady tick:

* ``<key>-status`` (markdown): bytes done/total, rate, ETA, files done/total, per state;
* ``<key>-progress`` (progress bar): the same bytes as a percentage;
* ``<key>-files`` (table): one row per file with its planned action, then its state
  (downloading, resumed, verified, reused, refused/failed with the reason) and sha256.

Events only change memory; one ticker thread makes the API calls, every ``interval`` seconds
(``$K3A_PROGRESS_INTERVAL``, default 30 s), so a 1.56 TB run costs a few calls a minute
however many byte events it emits. Byte events arrive from jobs in the flow's own process; for
jobs on other workers the engine reports a file's bytes when its outcome comes back, so the
artifact is right either way, only coarser.
"""

from __future__ import annotations

import contextvars
import threading
import time
from datetime import UTC, datetime

from prefect import get_run_logger
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from k3artifacts.errors import Refusal
from k3artifacts.revisions.manifest import FileRecord
from k3artifacts.settings import load
from k3artifacts.staging.events import StageObserver
from k3artifacts.staging.hub import RemoteFile
from k3artifacts.staging.plan import PlannedFile, StagePlan

from .artifacts import LiveArtifact, duration, fields_table, human_bytes, sha256, size


def progress_interval(value: float | None = None) -> float:
    """Seconds between updates of a staging run's live artifacts."""
    return value if value is not None else load().progress_interval


class FlowObserver(StageObserver):
    """The live status, progress bar and files table of one staging run."""

    def __init__(self, key: str, title: str, interval: float | None = None):
        self.key = key
        self.title = title
        self.interval = progress_interval(interval)
        self.rows: dict[str, dict[str, object]] = {}
        self._lock = threading.Lock()
        self._total = 0
        self._done = 0
        self._moved = 0  # bytes this run received from the network
        self._started = time.monotonic()
        self._dirty = False
        self._outcome: str | None = None
        self._status: LiveArtifact | None = None
        self._table: LiveArtifact | None = None
        self._bar = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- engine events (any thread; memory only) -------------------------------------------

    def planned(
        self, files: list[RemoteFile], reused: set[str], plan: StagePlan | None = None
    ) -> None:
        if plan is not None:
            publish_plan(plan, self.key, self.title)
        actions = {f.path: f for f in plan.files} if plan is not None else {}
        with self._lock:
            self.rows = {
                f.path: {
                    "path": f.path,
                    "size": human_bytes(f.size),
                    "bytes": f.size,
                    "planned": _planned(actions.get(f.path), f.path in reused),
                    "state": "planned",
                    "sha256": "",
                }
                for f in files
            }
            self._total = sum(f.size for f in files)
            self._done = sum(f.size for f in files if f.path in reused)
            self._started = time.monotonic()
        self._status = LiveArtifact("markdown", f"{self.key}-status", self._render(),
                                    f"live status of staging {self.title}")
        self._bar = create_progress_artifact(self._percent(), key=f"{self.key}-progress",
                                             description=f"bytes of {self.title} verified")
        self._table = LiveArtifact("table", f"{self.key}-files", self._table_rows(),
                                   f"files of {self.title}: planned action, state, sha256")
        context = contextvars.copy_context()  # the thread needs the run's Prefect settings
        self._ticker = threading.Thread(target=context.run, args=(self._tick,),
                                        name=f"{self.key}-progress", daemon=True)
        self._ticker.start()

    def file_started(self, path: str, size: int) -> None:
        self._set(path, state="downloading")

    def file_resumed(self, path: str, offset: int) -> None:
        with self._lock:
            # Those bytes come next through advance(), re-read from disk: they count as done,
            # not towards the network rate.
            self._moved -= offset
        self._set(path, state=f"resumed at {human_bytes(offset)}")

    def advance(self, path: str, nbytes: int) -> None:
        with self._lock:
            self._done += nbytes
            self._moved += nbytes
            self._dirty = True

    def file_done(self, record: FileRecord, reused: bool) -> None:
        state = (f"reused from {record.reused_from[:12]}" if record.reused_from
                 else "reused" if reused else "verified")
        with self._lock:
            before = str(self.rows.get(record.path, {}).get("state", ""))
        if before.startswith("resumed"):
            state = f"verified ({before})"  # the table keeps that a partial file was resumed
        self._set(record.path, state=state, sha256=sha256(record.sha256))

    def file_failed(self, path: str, error: BaseException) -> None:
        if isinstance(error, Refusal):
            state = f"refused: {error.rule}: {error.detail}"
        else:
            state = f"failed: {type(error).__name__}: {error}"
        self._set(path, state=state)

    def note(self, message: str) -> None:
        get_run_logger().info("%s", message)

    def _set(self, path: str, **fields: object) -> None:
        with self._lock:
            if path in self.rows:
                self.rows[path].update(fields)
                self._dirty = True

    # -- what is sent ------------------------------------------------------------------------

    def close(self, outcome: str) -> None:
        """Stop the ticker and send the final state (``published``, ``failed: ...``)."""
        if self._ticker is None:
            return
        self._stop.set()
        self._ticker.join()
        self._outcome = outcome
        self._dirty = True
        try:
            self._flush()
        except Exception as exc:  # noqa: BLE001 - must not hide the run's own outcome or error
            get_run_logger().warning("could not update the progress artifacts: %s", exc)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._flush()
            except Exception as exc:  # noqa: BLE001 - a display never fails the staging
                get_run_logger().warning("could not update the progress artifacts: %s", exc)

    def _flush(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            text, rows, pct = self._render(), self._table_rows(), self._percent()
        self._status.update(text)
        update_progress_artifact(self._bar, pct)
        self._table.update(rows)

    def _percent(self) -> float:
        return round(min(100.0, 100.0 * self._done / max(self._total, 1)), 1)

    def _table_rows(self) -> list[dict[str, object]]:
        return [dict(r) for r in self.rows.values()]

    def _render(self) -> str:
        """The status text; the caller holds the lock."""
        elapsed = max(time.monotonic() - self._started, 1e-6)
        rate = self._moved / elapsed
        left = self._total - self._done
        states = [str(r["state"]) for r in self.rows.values()]
        done = sum(s.startswith(("verified", "reused")) for s in states)
        running = sum(s == "downloading" or s.startswith("resumed") for s in states)
        bad = sum(s.startswith(("refused", "failed")) for s in states)
        if self._outcome is not None:
            eta = "-"
        elif left <= 0:
            eta = "finishing (manifest, publish)"
        else:
            eta = duration(left / rate) if rate > 0 else "unknown (no bytes yet)"
        headline = self._outcome or f"{self._percent():.1f}% staged"
        return f"# {self.title}: {headline}\n\n" + fields_table([
            ("bytes", f"{human_bytes(self._done)} of {human_bytes(self._total)} "
                      f"({self._done:,} of {self._total:,} bytes)"),
            ("files", f"{done} of {len(states)} done; {running} in flight; {bad} refused/failed"),
            ("rate", f"{human_bytes(rate)}/s over {duration(elapsed)}"),
            ("ETA", eta),
            ("total size", size(self._total)),
            ("updated", f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC "
                        f"(every {self.interval:g} s)"),
        ])


def _planned(planned: PlannedFile | None, reused: bool) -> str:
    if planned is None:
        return "reuse (verified earlier)" if reused else "download"
    if planned.action == "reuse":
        return f"reuse from {planned.source_commit[:12]}"
    return "reuse (verified earlier)" if planned.action == "present" else "download"


def publish_plan(plan: StagePlan, key: str, title: str) -> None:
    """The plan as a table, before any transfer: one row per file (what happens to it and from
    where), then one row per action with the totals."""
    rows: list[dict[str, object]] = [
        {"path": f.path, "size": f.size, "action": f.action,
         "from": f"{f.source_commit[:12]}:{f.source_path}" if f.source_commit else ""}
        for f in plan.files
    ]
    rows += [
        {"path": f"TOTAL {action}", "size": total.bytes, "action": action,
         "from": f"{total.files} file(s)"}
        for action, total in plan.totals().items()
    ]
    create_table_artifact(
        rows, key=f"{key}-plan",
        description=f"plan of {title}: {plan.describe()}",
    )
