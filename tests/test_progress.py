"""The progress reporter on its own: counts that never go back or overshoot, periodic lines on
a steady clock even when nothing moves, and the display chosen for where stderr goes."""

from __future__ import annotations

import json
import logging

import pytest

from k3artifacts.reporting.logs import JsonFormatter, configure_logging
from k3artifacts.reporting.progress import (
    BarReporter,
    LineReporter,
    SilentReporter,
    StageProgress,
    make_reporter,
)
from k3artifacts.revisions.manifest import FileRecord
from k3artifacts.staging.hub import RemoteFile
from tests.support.waiting import wait_until


def remote(path: str, size: int) -> RemoteFile:
    return RemoteFile(path=path, size=size, entry_type="file", lfs_sha256="0" * 64, git_oid=None)


def record(path: str, size: int) -> FileRecord:
    return FileRecord(path=path, size=size, kind="weights", sha256="0" * 64, xxh3_128="0" * 32)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.docs: list[dict] = []
        self.setFormatter(JsonFormatter())

    def emit(self, rec: logging.LogRecord) -> None:
        self.docs.append(json.loads(self.format(rec)))


@pytest.fixture
def captured():
    configure_logging("json")
    handler = Lines()
    logger = logging.getLogger("k3artifacts")
    logger.addHandler(handler)
    yield handler.docs
    logger.removeHandler(handler)


def test_counts_are_capped_per_file_and_never_go_back(captured):
    reporter = LineReporter("staging", interval=60)
    observer = StageProgress(reporter)
    observer.planned([remote("a", 100), remote("b", 50)], reused=set())
    observer.advance("a", 80)
    observer.advance("a", -30)  # an S3 part rewound: not a step back
    observer.advance("a", 80)  # the server ignored Range: the file starts over
    assert reporter.bytes_done == 100
    observer.file_done(record("a", 100), reused=False)
    observer.file_done(record("b", 50), reused=True)  # never seen as bytes: counted whole
    assert (reporter.bytes_done, reporter.files_done) == (150, 2)
    reporter.close()
    (final,) = [d for d in captured if d.get("event") == "progress"]
    assert final["final"] and final["bytes_done"] == final["bytes_total"] == 150
    assert final["files_done"] == final["files_total"] == 2


def test_lines_come_on_a_steady_clock_even_when_stalled(captured):
    reporter = LineReporter("verifying", interval=0.05)
    with reporter:
        reporter.set_total(nbytes=1000, files=1)
        reporter.advance(400)

        def stalled_lines():  # no more bytes: lines still come, the rate falls to 0
            periodic = [d for d in captured if d.get("event") == "progress" and not d["final"]]
            return len(periodic) >= 4 and periodic[-1]["rate_bytes_per_s"] == 0

        wait_until(stalled_lines, "four progress lines, the last at rate 0", timeout=10)
    lines = [d for d in captured if d.get("event") == "progress"]
    periodic = [d for d in lines if not d["final"]]
    assert len(periodic) >= 4
    assert all(d["bytes_done"] == 400 for d in periodic)
    assert periodic[-1]["rate_bytes_per_s"] == 0 and periodic[-1]["eta_s"] is None
    assert lines[-1]["final"]


def test_a_failed_phase_does_not_claim_done(captured):
    with pytest.raises(RuntimeError), LineReporter("staging", interval=60) as reporter:
        reporter.advance(10)
        raise RuntimeError("network gone")
    assert not [d for d in captured if d.get("event") == "progress"]


def test_the_display_follows_where_stderr_goes(monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    assert isinstance(make_reporter("x"), LineReporter)
    assert isinstance(make_reporter("x", quiet=True), SilentReporter)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    assert isinstance(make_reporter("x"), BarReporter)
    # JSON for a log pipeline: lines even on a terminal.
    assert isinstance(make_reporter("x", log_format="json"), LineReporter)
