"""Run and record: what ``k3a smoke``, ``k3a eval run`` and the flows share. A report is
written create-once beside its tuple whatever its verdict: a failed run is evidence too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k3artifacts.readiness.run import Observer, run_readiness
from k3artifacts.readiness.suite import SmokeSettings, load_suite
from k3artifacts.releases.channels import read_state
from k3artifacts.releases.evaluations import (
    EvaluationRecord,
    ReadinessReport,
    baseline_of,
    latest_run,
    record_run,
)
from k3artifacts.releases.lookup import resolve_tuple
from k3artifacts.stores.base import Store

#: The regression margin of an eval run's own comparison (the gate uses the policy's).
DEFAULT_MARGIN = 0.05


@dataclass(frozen=True)
class Recorded:
    report: ReadinessReport
    record: EvaluationRecord
    written: bool


def smoke(store: Store, endpoint: str, name: str, settings: SmokeSettings, *, by: str,
          observer: Observer | None = None, api_key: str | None = None) -> Recorded:
    """Smoke-test ``endpoint`` for the tuple ``name`` (an id or a channel) and record it."""
    release = resolve_tuple(store, name)
    report = run_readiness(endpoint, release, settings, observer=observer, api_key=api_key)
    record, written = record_run(store, report, by=by)
    return Recorded(report, record, written)


def evaluate(store: Store, endpoint: str, name: str, suite_file: Path, *, channel: str,
             by: str, observer: Observer | None = None, api_key: str | None = None,
             margin: float = DEFAULT_MARGIN) -> Recorded:
    """Run the suite in ``suite_file`` against ``endpoint`` for tuple ``name``; compare with the
    latest run of the same suite file for the tuple now on ``channel`` (when another is there)."""
    release = resolve_tuple(store, name)
    suite, sha = load_suite(suite_file)
    current = read_state(store, channel).tuple_id
    base = None
    if current is not None and current != release.id:
        found = latest_run(store, current, kind="eval", suite_sha256=sha)
        base = baseline_of(found, channel, 1, margin) if found else None
    report = run_readiness(endpoint, release, suite.smoke, suite=suite, suite_sha256=sha,
                           baseline=base, observer=observer, api_key=api_key)
    record, written = record_run(store, report, by=by)
    return Recorded(report, record, written)
