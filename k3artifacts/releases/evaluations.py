"""Evaluation reports of a tuple, for the evaluation gate.

Two origins, told apart by the record, never by the report's own words:

* ``run``: a :class:`ReadinessReport` written by ``k3a smoke`` / ``k3a eval run`` (the
  ``readiness`` package) after it talked to an endpoint: the tuple id, the endpoint, the model
  name the server returned, the suite file's sha256, every check with its timing, the
  concurrency sweep. These are what the gate trusts.
* ``attached``: any JSON with ``suite``, ``passed`` and ``total`` handed to ``k3a eval attach``.
  Nothing ran it, so the gate refuses it; it stays as the recorded evidence of an override.

Both are signed records (``policy/signed.py``) of the identity that ran or attached them (role
``evaluate``), read only through that signature against the store's policy in force: a report
written by hand, or signed by an identity that may not evaluate, is refused by name
(UntrustedRecord, exit 4), never judged. They are stored create-once under
``releases/evaluations/<tuple-id>/<sha256 of the canonical report>.json``: the same report
twice is a no-op and a report is never edited, only superseded.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import ConfigError, UntrustedRecord, plain_validation_errors
from k3artifacts.judging.compare import Criteria, Judgement, compare
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.signed import Family, RecordTrust
from k3artifacts.releases.records import create_record, read_records
from k3artifacts.releases.tuples import TupleStore, check_tuple_id
from k3artifacts.stores.records import RecordStore

EVALUATIONS_PREFIX = "releases/evaluations/"


class EvaluationReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    suite: str = Field(min_length=1)
    passed: int = Field(ge=0)
    total: int = Field(gt=0)

    @model_validator(mode="after")
    def _counts(self) -> EvaluationReport:
        if self.passed > self.total:
            raise ValueError(f"passed ({self.passed}) is more than total ({self.total})")
        return self

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total


class CheckResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    passed: bool
    detail: str
    seconds: float = 0.0
    #: For suite cases: the kind of check (exact, regex, json_schema, tool_name).
    kind: str | None = None
    #: Why the case was not run (a code case where no sandbox could be had); it counts in no
    #: pass rate, and fails the run unless the policy allows it (``allow_unsandboxed_code``).
    skipped: str | None = None


class SweepPoint(BaseModel):
    """One concurrency level of the sweep; latencies in seconds (None: no request succeeded)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(gt=0)
    requests: int
    ok: int
    errors: int
    rate_limited: int
    ttft_p50: float | None
    ttft_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    tokens_per_s: float
    #: What the first failed request (not a 429) said, for the operator.
    first_error: str | None = None
    #: Why this level breaks the SLO; None: within it.
    breach: str | None = None


class Sweep(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    points: list[SweepPoint]
    #: The highest concurrency within the SLO after which throughput stops growing (< 10% per
    #: doubling) or the SLO breaks; None when even one request at a time breaks it.
    knee: int | None
    slo: dict[str, float]

    def at(self, concurrency: int) -> SweepPoint | None:
        return next((p for p in self.points if p.concurrency == concurrency), None)


class LatencySamples(BaseModel):
    """Per-request latencies of an eval run, one request at a time (seconds, in the order
    sent): the evidence the latency comparison judges (:mod:`k3artifacts.judging`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(gt=0)
    e2e: list[float]
    ttft: list[float]
    #: Requests that failed (not in the samples).
    errors: int = 0
    #: Rounds drawn: a run whose comparison was inconclusive draws more, up to its bound.
    rounds: int = Field(default=1, ge=1)


class Baseline(BaseModel):
    """The report this run was compared with: the one of the tuple on the target channel,
    and how far this run may fall behind it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    channel: str
    tuple_id: str
    report_sha256: str
    pass_rate: float
    #: At ``concurrency``.
    e2e_p99: float | None
    concurrency: int = Field(default=1, gt=0)
    #: Pass rate may drop by at most this much (absolute), the p99 grow by this fraction.
    #: (Runs recorded before the margin was are judged by the one they were run with.)
    margin: float = Field(default=0.05, ge=0)
    #: The baseline run's per-request end-to-end latencies (empty: it predates them).
    e2e_samples: list[float] = Field(default_factory=list)
    #: How the latency is judged (None: a comparison recorded before samples were, judged by
    #: its p99 and ``margin`` as it was run).
    criteria: Criteria | None = None


class ReadinessReport(BaseModel):
    """What ``k3a smoke`` / ``k3a eval run`` observed; hashed canonically, stored create-once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["smoke", "eval"]
    tuple_id: str
    endpoint: str
    #: The model name the run asked for (the tuple id, which a rendered server serves), and
    #: what the server answered with (/v1/models and the ``model`` field of its completions):
    #: a report binds to the tuple only when they agree.
    expected_model: str
    served_models: list[str]
    suite: str
    #: sha256 of the suite file's bytes (smoke: of the built-in checks' canonical definition).
    suite_sha256: str
    started_at: datetime
    seconds: float
    #: The readiness checks (models, chat, stream, ...): each must pass.
    checks: list[CheckResult]
    #: The suite's cases (eval runs): judged by pass rate.
    cases: list[CheckResult] = Field(default_factory=list)
    #: The suite's own threshold for the run's verdict; the gate applies the channel's.
    min_pass_rate: float = Field(default=1.0, ge=0, le=1)
    sweep: Sweep | None = None
    #: Per-request latencies (eval runs; None: a run recorded before they were).
    latency: LatencySamples | None = None
    baseline: Baseline | None = None
    #: The run's own latency judgement against ``baseline`` (advisory: the gate re-judges the
    #: samples under the policy in force).
    comparison: Judgement | None = None
    #: How this run is worse than the baseline beyond its margin, as found when it ran (the
    #: verdict re-derives it: :func:`judge`).
    regressions: list[str] = Field(default_factory=list)
    #: The endpoint could not be reached at all (connection refused, DNS, timeout on connect).
    unreachable: bool = False
    #: What isolated the model's code in the code cases (None: no sandbox, or none ran).
    code_sandbox: str | None = None
    #: The channel's policy, when the run was made, let it pass without the code cases where
    #: no sandbox could be had (``evaluation.allow_unsandboxed_code``).
    allow_unsandboxed_code: bool = False

    @property
    def judged(self) -> list[CheckResult]:
        """What the pass rate counts: the suite's cases that ran, or a smoke run's checks."""
        return [c for c in self.cases if c.skipped is None] if self.cases else self.checks

    @property
    def skipped(self) -> list[CheckResult]:
        return [c for c in self.cases if c.skipped is not None]

    @property
    def passed_count(self) -> int:
        return sum(1 for c in self.judged if c.passed)

    @property
    def pass_rate(self) -> float:
        return self.passed_count / len(self.judged) if self.judged else 0.0

    @property
    def failed(self) -> list[CheckResult]:
        """What ran and failed (a case not run is in :attr:`skipped`, never here)."""
        return [c for c in [*self.checks, *self.cases] if not c.passed and c.skipped is None]

    @property
    def verdict(self) -> str:
        return f"{self.suite}: {self.passed_count}/{len(self.judged)} = {self.pass_rate:.1%}"

    def problems(self) -> list[str]:
        """Why this run is NOT READY by its own criteria (empty: ready)."""
        return judge(self, min_pass_rate=self.min_pass_rate, baseline=self.baseline)

    @property
    def passed(self) -> bool:
        return not self.problems()


class EvaluationRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tuple_id: str
    report_sha256: str
    #: The identity whose key signed the record (the reader checks they agree).
    attached_by: str
    attached_at: datetime
    report: dict[str, Any]
    #: ``run``: written by a readiness run; ``attached``: handed in with `k3a eval attach`
    #: (records written before runs existed are all attached).
    origin: Literal["run", "attached"] = "attached"

    def parsed(self) -> EvaluationReport:
        if self.origin == "run":
            run = self.readiness()
            return EvaluationReport(
                suite=run.suite, passed=run.passed_count, total=max(1, len(run.judged))
            )
        return EvaluationReport.model_validate(self.report)

    def readiness(self) -> ReadinessReport:
        return ReadinessReport.model_validate(self.report)


EVALUATIONS = Family(EVALUATIONS_PREFIX, "evaluation", EvaluationRecord, "attached_by")


def evaluations_prefix(tuple_id: str) -> str:
    return f"{EVALUATIONS_PREFIX}{check_tuple_id(tuple_id)}/"


def parse_report(data: bytes, source: str) -> dict[str, Any]:
    hint = ('a report is a JSON object with "suite" (text), "passed" and "total" (whole '
            'numbers, passed <= total), plus any other fields')
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"evaluation report {source} is not JSON: {exc}", hint=hint) from None
    try:
        EvaluationReport.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(
            f"evaluation report {source} is not valid: {plain_validation_errors(exc)}", hint=hint
        ) from None
    return raw


def attach_evaluation(
    store: RecordStore,
    tuple_id: str,
    report: dict[str, Any],
    *,
    by: Acting,
    now: datetime | None = None,
) -> tuple[EvaluationRecord, bool]:
    """Attach ``report`` to a tuple as an override's evidence, signed by ``by``; returns
    (record, written). Same report again: not written."""
    EvaluationReport.model_validate(report)
    return _create(store, tuple_id, report, by=by, origin="attached", now=now)


def record_run(
    store: RecordStore, report: ReadinessReport, *, by: Acting, now: datetime | None = None
) -> tuple[EvaluationRecord, bool]:
    """Store what a readiness run observed, beside its tuple, signed by ``by``; returns
    (record, written)."""
    body = report.model_dump(mode="json")
    return _create(store, report.tuple_id, body, by=by, origin="run", now=now)


def _create(
    store: RecordStore,
    tuple_id: str,
    report: dict[str, Any],
    *,
    by: Acting,
    origin: Literal["run", "attached"],
    now: datetime | None,
) -> tuple[EvaluationRecord, bool]:
    TupleStore(store).get(tuple_id)  # the tuple must exist and be intact
    sha = canonical_digest(report)
    key = f"{evaluations_prefix(tuple_id)}{sha}.json"
    record = EvaluationRecord(
        tuple_id=tuple_id,
        report_sha256=sha,
        attached_by=by.name,
        attached_at=now or datetime.now(UTC),
        report=report,
        origin=origin,
    )
    return create_record(store, key, EVALUATIONS, record, tuple_id=tuple_id, by=by)


def list_evaluations(store: RecordStore, tuple_id: str, *,
                     trust: RecordTrust | None = None) -> list[EvaluationRecord]:
    """Reports attached to ``tuple_id``, oldest first, each verified (``trust``: the store's
    policy in force unless given); one that is not the record of its key is refused."""
    records = []
    for key, record in read_records(store, evaluations_prefix(tuple_id), EVALUATIONS,
                                    tuple_id=tuple_id, trust=trust):
        sha = canonical_digest(record.report)
        if (
            record.tuple_id != tuple_id
            or sha != record.report_sha256
            or not key.endswith(f"/{sha}.json")
        ):
            raise UntrustedRecord(key, "wrong-key", f"a report of {record.tuple_id} with sha256 "
                                  f"{sha[:12]}, not the one its key names")
        if record.origin == "run":
            try:
                run = record.readiness()
            except ValidationError as exc:
                raise UntrustedRecord(key, "malformed", "not a readiness report: "
                                      f"{plain_validation_errors(exc)}") from None
            if run.tuple_id != tuple_id:
                raise UntrustedRecord(key, "wrong-key", f"reports on {run.tuple_id}, not "
                                      f"{tuple_id}")
        records.append(record)
    return sorted(records, key=lambda r: r.attached_at)


def latest_run(
    store: RecordStore, tuple_id: str, *, kind: str = "eval", suite_sha256: str | None = None,
    trust: RecordTrust | None = None,
) -> EvaluationRecord | None:
    """The newest report a readiness run wrote for ``tuple_id`` (of that suite file, if given)."""
    runs = [
        r
        for r in list_evaluations(store, tuple_id, trust=trust)
        if r.origin == "run"
        and r.readiness().kind == kind
        and (suite_sha256 is None or r.readiness().suite_sha256 == suite_sha256)
    ]
    return runs[-1] if runs else None


def baseline_of(record: EvaluationRecord, channel: str, concurrency: int,
                margin: float, criteria: Criteria) -> Baseline:
    run = record.readiness()
    point = run.sweep.at(concurrency) if run.sweep else None
    return Baseline(
        channel=channel,
        tuple_id=run.tuple_id,
        report_sha256=record.report_sha256,
        pass_rate=run.pass_rate,
        e2e_p99=point.e2e_p99 if point else None,
        concurrency=concurrency,
        margin=margin,
        e2e_samples=run.latency.e2e if run.latency else [],
        criteria=criteria,
    )


def latency_judgement(samples: LatencySamples | None, baseline: Baseline) -> Judgement | None:
    """A candidate's per-request latencies against the baseline's, by the baseline's
    criteria; None where the baseline has no samples (it predates them: nothing to judge
    against). A candidate without samples is inconclusive (too few)."""
    if baseline.criteria is None or not baseline.e2e_samples:
        return None
    return compare(baseline.e2e_samples, samples.e2e if samples else [], baseline.criteria,
                   what="end-to-end latency")


def judge(report: ReadinessReport, *, min_pass_rate: float, baseline: Baseline | None,
          latency: tuple[int, float] | None = None,
          allow_unsandboxed_code: bool | None = None) -> list[str]:
    """The one judgement of a readiness run, for ``k3a eval run`` / ``k3a smoke`` (the run's
    own criteria) and for the evaluation gate (the run's own, then the channel policy's):
    every check passed, no case skipped (code cases without a sandbox) unless
    ``allow_unsandboxed_code`` (None: as the run recorded its policy), the pass rate, the
    end-to-end p99 at ``latency`` = (concurrency, limit in seconds), and no regression against
    ``baseline`` beyond its margin. Returns the problems, each one line; empty: ready."""
    problems = []
    if not report.checks:
        problems.append("no readiness check ran")
    allowed = report.allow_unsandboxed_code if allow_unsandboxed_code is None \
        else allow_unsandboxed_code
    if report.skipped and not allowed:
        problems.append(
            f"{len(report.skipped)} code case(s) not run ({report.skipped[0].skipped}); the "
            "policy does not accept an evaluation without them (evaluation."
            "allow_unsandboxed_code)")
    failed = [c for c in report.checks if not c.passed]
    problems.extend(f"check {c.name} failed: {c.detail}" for c in failed[:4])
    if len(failed) > 4:
        problems.append(f"and {len(failed) - 4} more failed checks")
    if report.pass_rate < min_pass_rate:
        failed_cases = ", ".join(c.name for c in report.cases
                                 if not c.passed and c.skipped is None)
        problems.append(f"{report.verdict} is below the required {min_pass_rate:.1%}"
                        + (f" (failed: {failed_cases})" if failed_cases else ""))
    if latency is not None:
        concurrency, limit = latency
        point = report.sweep.at(concurrency) if report.sweep else None
        if point is None or point.e2e_p99 is None:
            problems.append(f"the sweep has no latency at concurrency {concurrency}")
        elif point.e2e_p99 > limit:
            problems.append(f"end-to-end p99 at concurrency {concurrency} is "
                            f"{point.e2e_p99:.3f} s > {limit:g} s")
    if baseline is not None:
        problems.extend(regressions(report, baseline, margin=baseline.margin,
                                    concurrency=baseline.concurrency))
    return problems


def regressions(
    report: ReadinessReport, baseline: Baseline, *, margin: float, concurrency: int
) -> list[str]:
    """How ``report`` is worse than ``baseline`` beyond ``margin`` (empty: no regression):
    its pass rate, and its latency by the judge where the baseline carries criteria (else by
    the p99 at ``concurrency``, as such a comparison was recorded)."""
    found = []
    if report.pass_rate < baseline.pass_rate - margin:
        found.append(
            f"pass rate {report.pass_rate:.1%} < {baseline.tuple_id}'s {baseline.pass_rate:.1%} "
            f"less the {margin:.1%} margin"
        )
    if baseline.criteria is not None:
        verdict = latency_judgement(report.latency, baseline)
        if verdict is not None and not verdict.passed:
            found.append(f"against {baseline.tuple_id}: {verdict.line}")
        return found
    point = report.sweep.at(concurrency) if report.sweep else None
    if baseline.e2e_p99 is not None and point is not None and point.e2e_p99 is not None:
        limit = baseline.e2e_p99 * (1 + margin)
        if point.e2e_p99 > limit:
            found.append(
                f"end-to-end p99 at concurrency {concurrency} {point.e2e_p99:.3f} s > "
                f"{baseline.tuple_id}'s {baseline.e2e_p99:.3f} s plus {margin:.0%}"
            )
    return found
