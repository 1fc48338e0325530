"""Run and record, planned first: what ``k3a smoke``, ``k3a eval run``, ``k3a eval attach`` and
the flows share. A report is written create-once beside its tuple whatever its verdict: a
failed run is evidence too.

The plan checks who runs it may sign evaluation reports (role ``evaluate``), resolves the
tuple, reads the suite file and the baseline run it is compared with; a refusal there (a
missing role, an unknown tuple, a malformed suite) sends no request to the endpoint. The act
runs the checks against the endpoint (:func:`k3artifacts.readiness.run.run_readiness`) and
records the report, signed by the runner's key.

An eval run samples per-request latency as the channel's policy says
(``evaluation.latency_regression``: the samples a round, the bound on rounds) and judges them
against the baseline's samples by that policy's criteria, recorded with the baseline so the
run's printed verdict can be re-derived; the evaluation gate judges the same samples again by
the policy in force when the tuple moves (the run's verdict is advisory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3artifacts.policy.actor import Acting
from k3artifacts.policy.model import LatencyRegressionPolicy
from k3artifacts.policy.record import in_force
from k3artifacts.policy.signed import require_role
from k3artifacts.readiness.code_run import NoSandbox, missing
from k3artifacts.readiness.latency import Sampling
from k3artifacts.readiness.run import Observer, run_readiness
from k3artifacts.readiness.suite import SmokeSettings, Suite
from k3artifacts.readiness.suite_lookup import FoundSuite, channel_suite, find_suite
from k3artifacts.releases.channels import read_state
from k3artifacts.releases.evaluations import (
    Baseline,
    EvaluationRecord,
    ReadinessReport,
    attach_evaluation,
    baseline_of,
    latest_run,
    parse_report,
    record_run,
)
from k3artifacts.releases.lookup import resolve_tuple
from k3artifacts.releases.tuples import ReleaseTuple, TupleStore, check_tuple_id
from k3artifacts.stores.base import Store

#: The pass-rate margin of an eval run's own comparison for a channel with no evaluation
#: policy (the gate uses the policy's).
DEFAULT_MARGIN = 0.05


@dataclass(frozen=True)
class Recorded:
    report: ReadinessReport
    record: EvaluationRecord
    written: bool
    #: Where an eval run's suite came from (the policy version and file, or a path).
    suite_source: str | None = None
    #: Why code cases were not run: no sandbox here, and what gives this machine one.
    no_sandbox: NoSandbox | None = None


@dataclass(frozen=True)
class ReadinessPlan:
    """A smoke (``suite`` None) or eval run to make of ``endpoint``; nothing sent yet."""

    release: ReleaseTuple
    endpoint: str
    settings: SmokeSettings
    suite: Suite | None
    suite_sha256: str | None
    baseline: Baseline | None
    #: Who runs it, with the key the report is signed with.
    by: Acting
    #: The channel's policy lets code cases go unrun where no sandbox can be had.
    allow_unsandboxed_code: bool = False
    #: Where an eval run's suite came from (the policy version and file, or a path).
    suite_source: str | None = None
    #: Per-request latencies an eval run draws (None: a smoke run draws none).
    sampling: Sampling | None = None


def plan_smoke(store: Store, endpoint: str, name: str, settings: SmokeSettings, *,
               by: Acting) -> ReadinessPlan:
    """Smoke ``endpoint`` for the tuple ``name`` (an id or a channel); RoleRefused (exit 9)
    for a runner without the role ``evaluate``."""
    require_role(by, "evaluation", "a smoke report")
    return ReadinessPlan(resolve_tuple(store, name), endpoint, settings, None, None, None, by)


def plan_evaluation(store: Store, endpoint: str, name: str, suite: str | Path | None, *,
                    channel: str, by: Acting) -> ReadinessPlan:
    """Run a suite against ``endpoint`` for tuple ``name``, compared with the latest run of the
    same suite for the tuple now on ``channel`` (when another is there).

    ``suite``: a file, or a suite of the store's policy in force by name (``k3-core``); None:
    the suite ``channel``'s policy names. The channel's policy also says whether the run may
    pass with its code cases not run for want of a sandbox (``allow_unsandboxed_code``).
    RoleRefused (exit 9) for a runner without the role ``evaluate``."""
    require_role(by, "evaluation", "an evaluation report")
    release = resolve_tuple(store, name)
    policy = in_force(store)
    found: FoundSuite = (channel_suite(policy, channel) if suite is None
                         else find_suite(policy, str(suite)))
    rule = policy.document.gates.channels.get(channel)
    settings = rule.evaluation if rule else None
    allow = bool(settings and settings.allow_unsandboxed_code)
    latency = settings.latency_regression if settings else LatencyRegressionPolicy()
    # No policy for the channel: compare by the defaults; a policy without max_regression:
    # compare nothing (the samples are still drawn, for the runs that come after).
    margin = DEFAULT_MARGIN if settings is None else settings.max_regression
    current = read_state(store, channel).tuple_id
    base = None
    if margin is not None and current is not None and current != release.id:
        latest = latest_run(store, current, kind="eval", suite_sha256=found.sha256)
        base = baseline_of(latest, channel, 1, margin, latency.criteria()) if latest else None
    return ReadinessPlan(release, endpoint, found.suite.smoke, found.suite, found.sha256, base,
                         by, allow_unsandboxed_code=allow, suite_source=found.source,
                         sampling=Sampling(latency.min_samples, latency.max_samples))


def act_readiness(store: Store, plan: ReadinessPlan, *, observer: Observer | None = None,
                  api_key: str | None = None) -> Recorded:
    report = run_readiness(plan.endpoint, plan.release, plan.settings, suite=plan.suite,
                           suite_sha256=plan.suite_sha256, baseline=plan.baseline,
                           observer=observer, api_key=api_key,
                           allow_unsandboxed_code=plan.allow_unsandboxed_code,
                           sampling=plan.sampling)
    record, written = record_run(store, report, by=plan.by)
    return Recorded(report, record, written, plan.suite_source,
                    missing() if report.skipped else None)


def smoke(store: Store, endpoint: str, name: str, settings: SmokeSettings, *, by: Acting,
          observer: Observer | None = None, api_key: str | None = None) -> Recorded:
    """The smoke move: :func:`plan_smoke`, then :func:`act_readiness`."""
    return act_readiness(store, plan_smoke(store, endpoint, name, settings, by=by),
                         observer=observer, api_key=api_key)


def evaluate(store: Store, endpoint: str, name: str, suite: str | Path | None, *, channel: str,
             by: Acting, observer: Observer | None = None,
             api_key: str | None = None) -> Recorded:
    """The evaluation-run move: :func:`plan_evaluation`, then :func:`act_readiness`."""
    plan = plan_evaluation(store, endpoint, name, suite, channel=channel, by=by)
    return act_readiness(store, plan, observer=observer, api_key=api_key)


@dataclass(frozen=True)
class AttachPlan:
    """A report handed in by hand, checked; not recorded yet."""

    release: ReleaseTuple
    report: dict[str, Any]
    by: Acting


def plan_attach(store: Store, tuple_id: str, data: bytes, source: str, *,
                by: Acting) -> AttachPlan:
    """Check ``by`` may sign evaluation reports (RoleRefused, exit 9), ``data`` is one (JSON
    with suite, passed, total: ConfigError, exit 9) and the tuple exists (NotFound, exit 7)."""
    require_role(by, "evaluation", "an attached evaluation report")
    report = parse_report(data, source)
    return AttachPlan(TupleStore(store).get(check_tuple_id(tuple_id)), report, by)


def act_attach(store: Store, plan: AttachPlan) -> tuple[EvaluationRecord, bool]:
    return attach_evaluation(store, plan.release.id, plan.report, by=plan.by)


def attach(store: Store, tuple_id: str, data: bytes, source: str, *,
           by: Acting) -> tuple[EvaluationRecord, bool]:
    """The attach move (an override's evidence; the evaluation gate does not accept it):
    :func:`plan_attach`, then :func:`act_attach`. Same report again: not written."""
    return act_attach(store, plan_attach(store, tuple_id, data, source, by=by))
