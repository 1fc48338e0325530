"""Run and record: what ``k3a smoke``, ``k3a eval run`` and the flows share. A report is
written create-once beside its tuple whatever its verdict: a failed run is evidence too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k3artifacts.policy.record import in_force
from k3artifacts.readiness.run import Observer, run_readiness
from k3artifacts.readiness.suite import SmokeSettings
from k3artifacts.readiness.suite_lookup import FoundSuite, channel_suite, find_suite
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
    #: Where an eval run's suite came from (the policy version and file, or a path).
    suite_source: str | None = None


def smoke(store: Store, endpoint: str, name: str, settings: SmokeSettings, *, by: str,
          observer: Observer | None = None, api_key: str | None = None) -> Recorded:
    """Smoke-test ``endpoint`` for the tuple ``name`` (an id or a channel) and record it."""
    release = resolve_tuple(store, name)
    report = run_readiness(endpoint, release, settings, observer=observer, api_key=api_key)
    record, written = record_run(store, report, by=by)
    return Recorded(report, record, written)


def evaluate(store: Store, endpoint: str, name: str, suite: str | Path | None, *, channel: str,
             by: str, observer: Observer | None = None, api_key: str | None = None,
             margin: float = DEFAULT_MARGIN) -> Recorded:
    """Run a suite against ``endpoint`` for tuple ``name`` and record it; compare with the
    latest run of the same suite for the tuple now on ``channel`` (when another is there).

    ``suite``: a file, or a suite of the store's policy in force by name (``k3-core``); None:
    the suite ``channel``'s policy names. The channel's policy also says whether the run may
    pass with its code cases not run for want of a sandbox (``allow_unsandboxed_code``)."""
    release = resolve_tuple(store, name)
    policy = in_force(store)
    found: FoundSuite = (channel_suite(policy, channel) if suite is None
                         else find_suite(policy, str(suite)))
    rule = policy.document.gates.channels.get(channel)
    allow = bool(rule and rule.evaluation and rule.evaluation.allow_unsandboxed_code)
    current = read_state(store, channel).tuple_id
    base = None
    if current is not None and current != release.id:
        latest = latest_run(store, current, kind="eval", suite_sha256=found.sha256)
        base = baseline_of(latest, channel, 1, margin) if latest else None
    report = run_readiness(endpoint, release, found.suite.smoke, suite=found.suite,
                           suite_sha256=found.sha256, baseline=base, observer=observer,
                           api_key=api_key, allow_unsandboxed_code=allow)
    record, written = record_run(store, report, by=by)
    return Recorded(report, record, written, found.source)
