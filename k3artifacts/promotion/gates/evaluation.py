"""The ``evaluation`` gate: a readiness run of the policy's suite, against an endpoint serving
this tuple, met the channel's thresholds.

Trusted evidence is a report a readiness run wrote (``origin: run``), for this tuple, of the
exact suite file the policy names (sha256), whose server answered as the tuple id. The gate
judges the latest such report with the one judgement ``k3a eval run`` uses
(:func:`k3artifacts.releases.evaluations.judge`), twice: by the run's own criteria (its suite's
threshold, its checks), then by the channel policy's (pass rate, end-to-end p99 at the
policy's concurrency, and no regression against the latest report of the tuple now on the
channel: the pass rate within ``max_regression``, the per-request latencies judged by
``latency_regression`` with :mod:`k3artifacts.judging`). The run's own latency comparison is
advisory: the gate judges the recorded samples again under the policy in force, so a later,
stricter policy re-judges the same evidence, and ``max_regression: null`` compares nothing.
A baseline run recorded before samples were is not compared by latency (the reason says so);
a candidate run without samples is inconclusive, counted as the policy's ``inconclusive``
says. A report
handed in with ``k3a eval attach`` is an override's evidence, not a run: the gate names it and
refuses; the promotion may override the gate with a reason, which the history records. Every
report is read through its signature (role ``evaluate``, against the policy in force): one
written by hand, or signed by an identity that may not evaluate, is refused by name
(UntrustedRecord, exit 4), never judged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

from k3artifacts.errors import ConfigError
from k3artifacts.policy.document import SUITES_DIR, PolicyDocument
from k3artifacts.policy.model import EvaluationPolicy
from k3artifacts.policy.results import GateResult
from k3artifacts.policy.signed import RecordTrust
from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.releases.channels import read_state
from k3artifacts.releases.evaluations import (
    EVALUATIONS,
    Baseline,
    EvaluationRecord,
    ReadinessReport,
    baseline_of,
    judge,
    latency_judgement,
    latest_run,
    list_evaluations,
)
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.stores.records import RecordStore

NAME = "evaluation"


def _fail(reason: str) -> GateResult:
    return GateResult(name=NAME, passed=False, reason=reason)


def _candidates(records: list[EvaluationRecord], policy: EvaluationPolicy,
                suite_sha: str | None) -> list[EvaluationRecord]:
    return [
        r for r in records
        if r.origin == "run"
        and r.readiness().kind == "eval"
        and (policy.suite is None or r.readiness().suite == policy.suite)
        and (suite_sha is None or r.readiness().suite_sha256 == suite_sha)
    ]


def _missing(release: ReleaseTuple, records: list[EvaluationRecord], policy: EvaluationPolicy,
             suite_sha: str | None) -> GateResult:
    suite = policy.suite_file or policy.suite or "the suite"
    parts = [f"no evaluation run of {suite}"
             + (f" (sha256 {suite_sha[:12]})" if suite_sha else "") + f" for {release.id}"]
    other = [r.readiness() for r in records if r.origin == "run"
             and r.readiness().kind == "eval"]
    if other:
        last = other[-1]
        parts.append(f"the latest run is of suite {last.suite!r} sha256 "
                     f"{last.suite_sha256[:12]}, not the policy's")
    smoke = [r for r in records if r.origin == "run" and r.readiness().kind == "smoke"]
    if smoke:
        parts.append(f"{len(smoke)} smoke report(s) do not count (no suite)")
    attached = [r for r in records if r.origin == "attached"]
    if attached:
        parts.append(
            f"{len(attached)} report(s) attached by hand (latest by {attached[-1].attached_by}) "
            f"are not runs: accept one only with `--override-gate {NAME} --reason ...`")
    parts.append(f"run `k3a eval run ENDPOINT --tuple {release.id} --suite "
                 f"{_suite_spec(policy.suite_file) if policy.suite_file else 'SUITE'}`")
    return _fail("; ".join(parts))


def _suite_spec(suite_file: str) -> str:
    """How `k3a eval run --suite` names the policy's suite file: by its name where it is one
    of the policy's suites (found in the store's policy from any directory), else its file in
    the policy. Never a checkout path: the policy in force is the store's."""
    path = PurePosixPath(suite_file)
    if path.parent == PurePosixPath(SUITES_DIR) and path.suffix == ".yaml":
        return path.stem
    return suite_file


def check(ctx: GateContext) -> GateResult:
    assert ctx.policy.evaluation is not None  # ChannelPolicy refuses the gate without settings
    return evaluation_gate(ctx.store, ctx.release, ctx.policy.evaluation, channel=ctx.channel,
                           document=ctx.document, trust=ctx.trust,
                           only=lambda records: ctx.signed_here(records, EVALUATIONS))


def evaluation_gate(
    store: RecordStore,
    release: ReleaseTuple,
    policy: EvaluationPolicy,
    *,
    channel: str,
    document: PolicyDocument,
    trust: RecordTrust,
    only: Callable[[list[EvaluationRecord]], list[EvaluationRecord]] = list,
) -> GateResult:
    try:
        suite_sha = (
            document.file_sha256(policy.suite_file) if policy.suite_file else None
        )
    except ConfigError as exc:
        return _fail(f"the policy's {exc}")
    records = only(list_evaluations(store, release.id, trust=trust))
    runs = _candidates(records, policy, suite_sha)
    if not runs:
        return _missing(release, records, policy, suite_sha)
    latest = runs[-1]
    run = latest.readiness()
    which = f"run {latest.report_sha256[:12]} of {run.endpoint} at {run.started_at:%Y-%m-%d %H:%M}"
    problems = []
    if run.expected_model != release.id:
        problems.append(f"it asked for model {run.expected_model!r}, not the tuple id "
                        f"{release.id!r} (a run from before readiness was bound to the tuple: "
                        "run it again)")
    elif release.id not in run.served_models:
        problems.append(f"the server answered as {run.served_models or 'nothing'}, "
                        f"not {release.id!r}")
    # The run's own verdict first (its suite's threshold, its checks), not its comparison
    # with a baseline: that is the policy's to judge. Then the channel policy's, by the same
    # judgement.
    own = judge(run, min_pass_rate=run.min_pass_rate, baseline=None)
    problems.extend(own)
    concurrency = policy.latency.concurrency if policy.latency else 1
    baseline = _channel_baseline(store, release, channel=channel, policy=policy,
                                 suite_sha=suite_sha, concurrency=concurrency, trust=trust)
    for problem in judge(
        run, min_pass_rate=policy.min_pass_rate, baseline=baseline,
        latency=(concurrency, policy.latency.max_e2e_p99_s) if policy.latency else None,
        allow_unsandboxed_code=policy.allow_unsandboxed_code,
    ):
        if problem not in own:
            problems.append(problem)
    if problems:
        return _fail(f"{which}: " + "; ".join(problems))
    return GateResult(name=NAME, passed=True,
                      reason=f"{run.verdict} >= {policy.min_pass_rate:.1%}, served as "
                             f"{release.id!r} ({which}); {_latency_note(run, baseline)}")


def _latency_note(run: ReadinessReport, baseline: Baseline | None) -> str:
    """What the latency comparison said, for a passing gate's reason."""
    if baseline is None:
        return "latency not compared (no max_regression, or no run of the channel's tuple)"
    verdict = latency_judgement(run.latency, baseline)
    if verdict is None:
        return (f"latency not compared: {baseline.tuple_id}'s run {baseline.report_sha256[:12]} "
                "predates per-request samples")
    return f"latency against {baseline.tuple_id}: {verdict.line}"


def _channel_baseline(store: RecordStore, release: ReleaseTuple, *, channel: str,
                      policy: EvaluationPolicy, suite_sha: str | None,
                      concurrency: int, trust: RecordTrust) -> Baseline | None:
    """The latest run of the tuple now on ``channel``, with the policy's margin and latency
    criteria; None when the policy compares nothing (``max_regression: null``)."""
    if policy.max_regression is None:
        return None
    current = read_state(store, channel).tuple_id
    if current is None or current == release.id:
        return None
    base = latest_run(store, current, kind="eval", suite_sha256=suite_sha, trust=trust)
    if base is None:
        return None  # nothing to compare with: the channel's tuple predates the suite
    return baseline_of(base, channel, concurrency, policy.max_regression,
                       policy.latency_regression.criteria())
